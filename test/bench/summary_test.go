/*
Copyright The Prism Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package bench

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// screen is how many lines the summary may take: one screen.
const screen = 30

func phases(names ...string) []PhaseTiming {
	var out []PhaseTiming
	for _, n := range names {
		out = append(out, PhaseTiming{Phase: n, Seconds: "1.0"})
	}
	return out
}

// summaryLines is the summary's line for each headline label.
func summaryLines(t *testing.T, rep *Report) map[string]string {
	t.Helper()
	var b strings.Builder
	Summary(&b, rep)
	t.Logf("summary:\n%s", b.String())
	lines := strings.Split(strings.TrimSuffix(b.String(), "\n"), "\n")
	if len(lines) > screen {
		t.Errorf("summary has %d lines, more than a screen (%d):\n%s", len(lines), screen, b.String())
	}
	got := map[string]string{}
	for _, l := range lines {
		for _, h := range Headlines {
			// A secondary row's label ends with its leading row's.
			if i := strings.Index(l, "  "+h.What()+"  "); i >= 0 {
				got[h.What()] = strings.Join(strings.Fields(l[i+len(h.What())+2:]), " ")
			}
		}
	}
	return got
}

func TestSummary(t *testing.T) {
	// Rows shaped as the phases emit them; the allocator's two fleet sizes
	// and the 20Gi profile check that the largest case of the named
	// profile is the one shown.
	rows := []Row{
		NewRow("allocator", "100 nodes, MemoryBound-performance", "mean per node", "µs", "plain", 10, "ladder", 15, ""),
		NewRow("allocator", "100 nodes, MemoryBound-performance", "mean per node", "µs", "plain, figures as capacity", 10, "ladder, capacity floor and bounds", 9, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance", "mean per node", "µs", "plain", 10, "ladder", 20, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance", "mean per node", "µs", "plain", 10, "ladder, capacity floor", 18, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance", "mean per node", "µs", "plain, figures as capacity", 10, "ladder, capacity floor and bounds", 7, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance", "mean per node", "µs", "selective", 40, "ladder", 20, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance", "mean per node", "µs", "selective, figures as capacity", 40, "ladder, capacity floor and bounds", 6, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance-20Gi", "mean per node", "µs", "plain", 10, "ladder", 90, ""),
		NewRow("allocator", "2000 nodes, MemoryBound-performance-20Gi", "mean per node", "µs", "plain, figures as capacity", 10, "ladder, capacity floor and bounds", 11, ""),
		NewRow("prepare", "real plugin", "floor: client GET of the claim vs prepare, p50", "ms", "GET claim", 2, "prepare 1 GPU", 3, ""),
		NewRow("prepare at scale", "8 GPUs, 500 claims", "NodePrepareResources", "ms", "p50", 4, "p99", 8, ""),
		NewRow("prepare at scale", "16 GPUs, 1000 claims", "NodePrepareResources", "ms", "p50", 4, "p99", 12, ""),
		NewRow("footprint", "same loop", "RSS idle (VmRSS)", "MiB", "floor", 20, "Prism", 30, ""),
		NewRow("footprint", "same loop", "RSS with 500 claims + 40 probes (VmRSS)", "MiB", "floor", 25, "Prism", 50, ""),
		NewRow("admission", "prism-controller", "mutating webhook p99", "ms", "no-annotation", 1, "rewrite", 1.5, ""),
		NewRow("usage sampling", "8 GPUs, 8 claims", "plugin CPU (utime+stime)", "s per minute", "sampling off", 0.2, "sampling on", 0.3, ""),
	}
	// The scheduling phase with --sched-figures-as-capacity, as the
	// phase emits them: plain against every kind, the selective claim
	// against the ladders.
	sched := func(kinds ...string) []Row {
		cse := "500 nodes x 8 GPUs, MemoryBound-performance"
		rate := map[string]float64{"selective": 15, "ladder": 25, "ladder-capacity": 26, "ladder-bounds": 52, "affinity": 40}
		p99 := map[string]float64{"selective": 900, "ladder": 700, "ladder-capacity": 680, "ladder-bounds": 210, "affinity": 300}
		var out []Row
		for _, k := range kinds {
			out = append(out,
				NewRow("scheduling", cse, "pods bound per second", "pods/s", "plain", 50, k, rate[k], ""),
				NewRow("scheduling", cse, "create-to-bound p50", "ms", "plain", 100, k, p99[k]/2, ""),
				NewRow("scheduling", cse, "create-to-bound p99", "ms", "plain", 200, k, p99[k], ""))
		}
		for _, k := range kinds[1:] {
			out = append(out, NewRow("scheduling", cse, "pods bound per second", "pods/s", "selective", 15, k, rate[k], ""))
		}
		return out
	}
	all := func(ratio string) map[string]string {
		m := map[string]string{}
		for _, h := range Headlines {
			m[h.What()] = ratio
		}
		return m
	}
	for _, tc := range []struct {
		name string
		rep  *Report
		want map[string]string // by label; unnamed labels as in base
		base string
	}{
		{
			name: "nothing run",
			rep:  &Report{},
			base: "not run",
		},
		{
			name: "some phases, some rows",
			rep:  &Report{Rows: rows, Phases: phases("allocator", "testbed", "prepare", "admission", "usage")},
			want: map[string]string{
				"rewritten ladder vs plain claim, µs per node":                 "0.70x plain, figures as capacity 10.0 → ladder, capacity floor and bounds 7.00 µs (2000 nodes, MemoryBound-performance)",
				"rewritten ladder vs the preference written by hand":           "0.15x selective, figures as capacity 40.0 → ladder, capacity floor and bounds 6.00 µs (2000 nodes, MemoryBound-performance)",
				"CEL form: rewritten ladder vs plain claim, µs per node":       "2.00x plain 10.0 → ladder 20.0 µs (2000 nodes, MemoryBound-performance)",
				"CEL form: rewritten ladder vs the preference written by hand": "0.50x selective 40.0 → ladder 20.0 µs (2000 nodes, MemoryBound-performance)",
				"prepare p50, 1 GPU, Prism vs reference driver":                "not measured needs --reference-plugin",
				"prepare p99, 1 GPU, Prism vs reference driver":                "not measured needs --reference-plugin",
				"prepare p50, 1 GPU, vs a client GET of the claim":             "1.50x GET claim 2.00 → prepare 1 GPU 3.00 ms",
				"prepare p99 vs p50, node full of memory-share claims":         "3.00x p50 4.00 → p99 12.0 ms",
				"plugin RSS with claims, Prism vs floor plugin":                "2.00x floor 25.0 → Prism 50.0 MiB",
				"plugin RSS after prepare load, Prism vs reference":            "not measured needs --reference-plugin",
				"webhook p99 under load, rewrite vs no-annotation":             "1.50x no-annotation 1.00 → rewrite 1.50 ms",
				"plugin CPU, NVML usage sampling on vs off":                    "1.50x sampling off 0.20 → sampling on 0.30 s per minute",
			},
			base: "not run",
		},
		{
			name: "mig-alloc: the idle case of the whole GPU, the busy case of the ladder",
			rep: &Report{Phases: phases("mig-alloc"), Rows: []Row{
				NewRow("mig allocator", migAllocCaseName(8, migAllocIdle), "median per node", "µs", migAllocReference, 50, "plain claim, MIG node", 250, ""),
				NewRow("mig allocator", migAllocCaseName(8, migAllocIdle), "median per node", "µs", migAllocReference, 50, "light job's ladder, MIG node", 500, ""),
				NewRow("mig allocator", migAllocCaseName(8, migAllocBusy), "median per node", "µs", migAllocReference, 50, "plain claim, MIG node", 1500, ""),
				NewRow("mig allocator", migAllocCaseName(8, migAllocBusy), "median per node", "µs", migAllocReference, 50, "light job's ladder, MIG node", 4000, ""),
			}},
			want: map[string]string{
				"whole GPU, 8-GPU MIG node vs plain node, µs":    "5.00x plain claim, plain node 50.0 → plain claim, MIG node 250 µs",
				"light job's ladder, half-cut MIG node vs plain": "80.00x plain claim, plain node 50.0 → light job's ladder, MIG node 4000 µs",
			},
			base: "not run",
		},
		{
			name: "the allocator phase alone",
			rep:  &Report{Rows: rows[:9], Phases: phases("allocator")},
			want: map[string]string{
				"rewritten ladder vs plain claim, µs per node":                 "0.70x plain, figures as capacity 10.0 → ladder, capacity floor and bounds 7.00 µs (2000 nodes, MemoryBound-performance)",
				"rewritten ladder vs the preference written by hand":           "0.15x selective, figures as capacity 40.0 → ladder, capacity floor and bounds 6.00 µs (2000 nodes, MemoryBound-performance)",
				"CEL form: rewritten ladder vs plain claim, µs per node":       "2.00x plain 10.0 → ladder 20.0 µs (2000 nodes, MemoryBound-performance)",
				"CEL form: rewritten ladder vs the preference written by hand": "0.50x selective 40.0 → ladder 20.0 µs (2000 nodes, MemoryBound-performance)",
			},
			base: "not run",
		},
		{
			name: "scheduling as make bench runs it: the shipped ladder leads, the CEL ladder follows",
			rep:  &Report{Rows: sched("selective", "ladder", "ladder-capacity", "affinity", "ladder-bounds"), Phases: phases("testbed", "scheduling")},
			want: map[string]string{
				"pods bound per second, ladder vs plain claim":           "1.04x plain 50.0 → ladder-bounds 52.0 pods/s",
				"create-to-bound p99, ladder vs plain claim":             "1.05x plain 200 → ladder-bounds 210 ms",
				"CEL form: pods bound per second, ladder vs plain claim": "0.50x plain 50.0 → ladder 25.0 pods/s",
				"CEL form: create-to-bound p99, ladder vs plain claim":   "3.50x plain 200 → ladder 700 ms",
			},
			base: "not run",
		},
		{
			name: "scheduling with --sched-figures-as-capacity=false: the CEL ladder alone",
			rep:  &Report{Rows: sched("selective", "ladder", "ladder-capacity", "affinity"), Phases: phases("testbed", "scheduling")},
			want: map[string]string{
				"pods bound per second, ladder vs plain claim":           "not measured --sched-figures-as-capacity was off",
				"create-to-bound p99, ladder vs plain claim":             "not measured --sched-figures-as-capacity was off",
				"CEL form: pods bound per second, ladder vs plain claim": "0.50x plain 50.0 → ladder 25.0 pods/s",
				"CEL form: create-to-bound p99, ladder vs plain claim":   "3.50x plain 200 → ladder 700 ms",
			},
			base: "not run",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := all(tc.base)
			for k, v := range tc.want {
				want[k] = v
			}
			if diff := cmp.Diff(want, summaryLines(t, tc.rep)); diff != "" {
				t.Errorf("summary lines (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHeadlinesFitOneScreen: the title, the header and one line per
// headline, each label its own (the summary is read by label).
func TestHeadlinesFitOneScreen(t *testing.T) {
	seen := map[string]bool{}
	for _, h := range Headlines {
		if seen[h.What()] {
			t.Errorf("two headlines are labelled %q", h.What())
		}
		seen[h.What()] = true
	}
	if n := 2 + len(Headlines); n > screen {
		t.Errorf("the summary takes %d lines, more than a screen (%d): drop a headline", n, screen)
	}
}

// TestHeadlinesLeadWithTheShippedForm: the allocator and scheduling phases'
// rewrite rows compare the ladder the controller writes by default against a
// plain claim on the same slices, and the CEL form follows each as a
// secondary row, labelled as such.
func TestHeadlinesLeadWithTheShippedForm(t *testing.T) {
	type rewriteRow struct {
		Label, Form, AName, BName string
	}
	want := map[string][]rewriteRow{
		"allocator": {
			{"rewritten ladder vs plain claim, µs per node", "capacity", "plain, figures as capacity", "ladder, capacity floor and bounds"},
			{"rewritten ladder vs the preference written by hand", "capacity", "selective, figures as capacity", "ladder, capacity floor and bounds"},
			{"CEL form: rewritten ladder vs plain claim, µs per node", "cel", "plain", "ladder"},
			{"CEL form: rewritten ladder vs the preference written by hand", "cel", "selective", "ladder"},
		},
		"scheduling": {
			{"pods bound per second, ladder vs plain claim", "capacity", "plain", "ladder-bounds"},
			{"create-to-bound p99, ladder vs plain claim", "capacity", "plain", "ladder-bounds"},
			{"CEL form: pods bound per second, ladder vs plain claim", "cel", "plain", "ladder"},
			{"CEL form: create-to-bound p99, ladder vs plain claim", "cel", "plain", "ladder"},
		},
	}
	got := map[string][]rewriteRow{}
	for _, h := range Headlines {
		if h.Form != "" {
			got[h.Phase] = append(got[h.Phase], rewriteRow{h.What(), h.Form.String(), h.AName, h.BName})
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the rewrite's headlines, in order (-want +got):\n%s", diff)
	}
}

// TestAllocatorHeadlinesFindTheirRows: a small allocator phase emits a row
// for each of its headlines, in both forms, so that a renamed claim cannot
// leave the summary "not measured".
func TestAllocatorHeadlinesFindTheirRows(t *testing.T) {
	rows, err := Allocator(t.Context(), AllocatorOptions{Sizes: []int{4}, Passes: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep := &Report{Rows: rows, Phases: phases("allocator")}
	for _, h := range Headlines {
		if h.Phase != "allocator" {
			continue
		}
		if ratio, detail := h.figure(rep); ratio == "" || ratio == "-" {
			t.Errorf("%q: no ratio from the allocator's rows (%q)", h.What(), detail)
		}
	}
}
