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
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// Headline is one line of the summary: a row of the table, picked by its
// section, metric and the two things it compares.
type Headline struct {
	// Phase is the prism-bench phase (--only) that measures it.
	Phase string
	// Label says what the ratio means.
	Label string
	// Section and Metric pick the rows; Metric matches the metrics that
	// start with it (some name a run parameter, such as a claim count).
	Section, Metric string
	// AName and BName narrow the rows to those comparing these two; empty
	// matches any (the controller-scale rows name their fleet sizes).
	AName, BName string
	// CaseSuffix narrows the rows to the cases that end with it.
	CaseSuffix string
	// ShowCase adds the row's case to the line: the phase has several and
	// the last one is shown.
	ShowCase bool
	// Hint says what a run of the phase needs to measure it.
	Hint string
	// Form is the form of the rewritten claim the row measures, where the
	// phase measures several (the controller's --memory-floor). The
	// ShippedForm's rows lead their phase; another form's follow as
	// secondary rows, labelled with the form (see What). Empty: the row is
	// not about the form.
	Form rewrite.Form
}

// What is the headline's label as the summary prints it: the row of a form
// the chart does not ship says which.
func (h Headline) What() string {
	if h.Form == "" || h.Form == ShippedForm {
		return h.Label
	}
	return strings.ToUpper(h.Form.String()) + " form: " + h.Label
}

// Headlines are the summary that `make bench` opens with. When several rows
// match one, the last is shown: the phases emit their largest case last.
// The allocator and scheduling rows lead with the ladder as the chart ships
// it (ShippedForm, on slices with the figures as capacities), against a
// plain claim on the same slices; the CEL form follows.
var Headlines = []Headline{
	{Phase: "allocator", Label: "rewritten ladder vs plain claim, µs per node", Section: "allocator", Metric: "mean per node",
		AName: "plain, " + figuresFleet, BName: allocShippedLadder, CaseSuffix: ", " + Profiles[0].Name, ShowCase: true, Form: ShippedForm},
	{Phase: "allocator", Label: "rewritten ladder vs the preference written by hand", Section: "allocator", Metric: "mean per node",
		AName: "selective, " + figuresFleet, BName: allocShippedLadder, CaseSuffix: ", " + Profiles[0].Name, ShowCase: true, Form: ShippedForm},
	{Phase: "allocator", Label: "rewritten ladder vs plain claim, µs per node", Section: "allocator", Metric: "mean per node",
		AName: "plain", BName: allocCELLadder, CaseSuffix: ", " + Profiles[0].Name, ShowCase: true, Form: rewrite.FormCEL},
	{Phase: "allocator", Label: "rewritten ladder vs the preference written by hand", Section: "allocator", Metric: "mean per node",
		AName: "selective", BName: allocCELLadder, CaseSuffix: ", " + Profiles[0].Name, ShowCase: true, Form: rewrite.FormCEL},
	{Phase: "mig-alloc", Label: "whole GPU, 8-GPU MIG node vs plain node, µs", Section: "mig allocator", Metric: "median per node",
		AName: migAllocReference, BName: "plain claim, MIG node", CaseSuffix: migAllocCaseName(8, migAllocIdle)},
	{Phase: "mig-alloc", Label: "light job's ladder, half-cut MIG node vs plain", Section: "mig allocator", Metric: "median per node",
		AName: migAllocReference, BName: "light job's ladder, MIG node", CaseSuffix: migAllocCaseName(8, migAllocBusy)},
	{Phase: "scheduling", Label: "pods bound per second, ladder vs plain claim", Section: "scheduling", Metric: "pods bound per second",
		AName: "plain", BName: schedShippedLadder, Form: ShippedForm, Hint: "--sched-figures-as-capacity was off"},
	{Phase: "scheduling", Label: "create-to-bound p99, ladder vs plain claim", Section: "scheduling", Metric: "create-to-bound p99",
		AName: "plain", BName: schedShippedLadder, Form: ShippedForm, Hint: "--sched-figures-as-capacity was off"},
	{Phase: "scheduling", Label: "pods bound per second, ladder vs plain claim", Section: "scheduling", Metric: "pods bound per second",
		AName: "plain", BName: schedCELLadder, Form: rewrite.FormCEL},
	{Phase: "scheduling", Label: "create-to-bound p99, ladder vs plain claim", Section: "scheduling", Metric: "create-to-bound p99",
		AName: "plain", BName: schedCELLadder, Form: rewrite.FormCEL},
	{Phase: "prepare", Label: "prepare p50, 1 GPU, Prism vs reference driver", Section: "prepare", Metric: "NodePrepareResources 1 GPU p50",
		AName: "example driver", BName: "Prism", Hint: "needs --reference-plugin"},
	{Phase: "prepare", Label: "prepare p99, 1 GPU, Prism vs reference driver", Section: "prepare", Metric: "NodePrepareResources 1 GPU p99",
		AName: "example driver", BName: "Prism", Hint: "needs --reference-plugin"},
	{Phase: "prepare", Label: "prepare p50, 1 GPU, vs a client GET of the claim", Section: "prepare", Metric: "floor: client GET of the claim vs prepare, p50",
		AName: "GET claim", BName: "prepare 1 GPU"},
	{Phase: "prepare", Label: "prepare p99 vs p50, node full of memory-share claims", Section: "prepare at scale", Metric: "NodePrepareResources",
		AName: "p50", BName: "p99", Hint: "--prepare-scale was empty"},
	{Phase: "prepare", Label: "plugin RSS with claims, Prism vs floor plugin", Section: "footprint", Metric: "RSS with ",
		AName: "floor", BName: "Prism", Hint: "needs --floor-plugin"},
	{Phase: "prepare", Label: "plugin RSS after prepare load, Prism vs reference", Section: "footprint", Metric: "RSS after prepare load (VmRSS)",
		AName: "example driver", BName: "Prism", Hint: "needs --reference-plugin"},
	{Phase: "admission", Label: "webhook p99 under load, rewrite vs no-annotation", Section: "admission", Metric: "mutating webhook p99",
		AName: "no-annotation", BName: "rewrite"},
	{Phase: "mps-daemons", Label: "share prepare p50, MPS daemon in a pod vs child", Section: "mps-daemons", Metric: "NodePrepareResources of a share, p50",
		AName: "child of the plugin", BName: "pod of its own"},
	{Phase: "mps-daemons", Label: "daemon-side RSS per share, pod vs child", Section: "mps-daemons", Metric: "daemon-side RSS per share",
		AName: "child of the plugin", BName: "pod of its own"},
	{Phase: "usage", Label: "plugin CPU, NVML usage sampling on vs off", Section: "usage sampling", Metric: "plugin CPU",
		AName: "sampling off", BName: "sampling on"},
	{Phase: "controller-scale", Label: "controller RSS after load, largest vs smallest fleet", Section: "controller scale", Metric: "RSS after admission load (VmRSS)"},
	{Phase: "controller-scale", Label: "webhook p99 (rewrite), largest vs smallest fleet", Section: "controller scale", Metric: "mutating webhook p99, rewrite"},
	{Phase: "controller-scale", Label: "controller start to first rewrite, largest vs smallest", Section: "controller scale", Metric: "start to first rewrite"},
}

// match is the last row the headline picks.
func (h Headline) match(rows []Row) (Row, bool) {
	for _, r := range slices.Backward(rows) {
		if r.Section == h.Section && strings.HasPrefix(r.Metric, h.Metric) && strings.HasSuffix(r.Case, h.CaseSuffix) &&
			(h.AName == "" || r.AName == h.AName) && (h.BName == "" || r.BName == h.BName) {
			return r, true
		}
	}
	return Row{}, false
}

// Summary writes one line per headline: the ratio B/A and the two figures
// it is taken from, "not run" where the run left the phase out, and "not
// measured" where the phase ran without it.
func Summary(w io.Writer, rep *Report) {
	ran := map[string]bool{}
	for _, p := range rep.Phases {
		ran[p.Phase] = true
	}
	fmt.Fprintf(w, "Summary: each ratio is B/A, both measured in this run; ladders as the chart ships them (--memory-floor=%s), then in the CEL form (--memory-floor=%s)\n", ShippedForm, rewrite.FormCEL)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PHASE\tWHAT\tB/A\tA → B")
	for _, h := range Headlines {
		ratio, detail := h.figure(rep)
		switch {
		case ratio != "":
		case !ran[h.Phase]:
			ratio = "not run"
		default:
			ratio = "not measured"
			if h.Hint != "" {
				detail = h.Hint
			}
		}
		line := h.Phase + "\t" + h.What() + "\t" + ratio
		if detail != "" {
			line += "\t" + detail
		}
		fmt.Fprintln(tw, line)
	}
	tw.Flush()
}

// figure is the headline's ratio and where it comes from; empty when the
// report lacks it.
func (h Headline) figure(rep *Report) (ratio, detail string) {
	r, ok := h.match(rep.Rows)
	if !ok {
		return "", ""
	}
	ratio = "-"
	if r.Ratio != 0 {
		ratio = fmt.Sprintf("%.2fx", r.Ratio)
	}
	detail = fmt.Sprintf("%s %s → %s %s %s", r.AName, fmtNum(r.A), r.BName, fmtNum(r.B), r.Unit)
	if h.ShowCase {
		detail += " (" + r.Case + ")"
	}
	return ratio, detail
}
