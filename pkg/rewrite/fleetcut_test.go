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

package rewrite

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

func loadFleet(t testing.TB, name string) *Fleet {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "fleets.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Fleets map[string][]Model `json:"fleets"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	models, ok := f.Fleets[name]
	if !ok {
		t.Fatalf("no fleet %q in testdata/fleets.json", name)
	}
	return &Fleet{Models: models}
}

// tierSpec is a tier as a reader checks it: name and its own selectors
// written as "attribute op threshold".
type tierSpec struct {
	name  string
	tests []string
}

func bwAtLeast(v int64) string { return "memoryBandwidthGBps >= " + itoa(v) }
func bwBelow(v int64) string   { return "memoryBandwidthGBps < " + itoa(v) }
func fpAtLeast(v int64) string { return "fp32GFLOPS >= " + itoa(v) }

// readable turns a catalogue threshold selector back into "attr op value".
func readable(t *testing.T, expr string) string {
	t.Helper()
	for f := range numFigures {
		for _, g := range thresholdGrids[f] {
			for _, below := range []bool{false, true} {
				i := slices.Index(thresholdGrids[f], g)
				if catalogue[thresholdSelector(f, i, below)] == expr {
					op := " >= "
					if below {
						op = " < "
					}
					return string(f.attribute()) + op + itoa(g)
				}
			}
		}
	}
	t.Fatalf("%q is not a threshold selector", expr)
	return ""
}

// TestFleetCut pins the ladders on hand-computed fleets. The thresholds
// follow from the figures in testdata/fleets.json: a class boundary sits in
// every gap of at least 30 % (the two largest if there are more), at the
// highest R10 grid point that every model above the gap reaches.
func TestFleetCut(t *testing.T) {
	fits := tierSpec{name: "fits"}
	for _, tc := range []struct {
		fleet  string
		bound  prismv1alpha1.BoundType
		policy prismv1alpha1.Policy
		want   []tierSpec // nil: claim unchanged
	}{
		// H100 3350 | A100 1555 | L4 300 GB/s: two gaps, both cut; the
		// A100s are 5x the L4s, so performance keeps a middle tier.
		{"h100-a100-l4", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"bandwidth-top", []string{bwAtLeast(3150)}}, {"bandwidth-second", []string{bwAtLeast(1250)}}, fits}},
		{"h100-a100-l4", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"bandwidth-value", []string{bwAtLeast(1250), bwBelow(3150)}}, fits}},
		// H100 67 | L4 30.3 | A100 19.5 TFLOPS: L4 is not 2x the A100, so
		// no middle tier; economy takes the L4 (45 % of the best, no HBM).
		{"h100-a100-l4", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(63000)}}, fits}},
		{"h100-a100-l4", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"fp32-value", []string{fpAtLeast(25000), bwBelow(3150)}}, fits}},
		// Latency-bound jobs rank by FP32 as compute-bound ones do: a big
		// card is not wasted on them while it is free.
		{"h100-a100-l4", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(63000)}}, fits}},
		{"h100-a100-l4", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"bandwidth-bottom", []string{bwBelow(1250)}}, fits}},

		// V100 900, P100 732, A10 600 GB/s are within 30 % of each other;
		// T4 (320) is 1.9x below A10: one cut, at 500.
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"bandwidth-top", []string{bwAtLeast(500)}}, fits}},
		// T4 is at 36 % of a V100: not adequate, so economy has no cheaper
		// choice than performance.
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"bandwidth-top", []string{bwAtLeast(500)}}, fits}},
		// A10 31.2 | V100 15.7 | P100 9.3, T4 8.1 TFLOPS: the absolute
		// fp32-fast tier matched nothing here; the A10s lead now.
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(25000)}}, fits}},
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"fp32-top", []string{fpAtLeast(25000)}}, fits}},
		// Latency-bound: the fastest cards first; only economy takes the T4s.
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(25000)}}, fits}},
		{"t4-p100-v100-a10", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"bandwidth-bottom", []string{bwBelow(500)}}, fits}},

		// The placement sweep's fleet: a K80 publishes no FP32 figure (the
		// plugin does not know Kepler's lanes per SM). V100 15667 | P100
		// 9525: compute-bound jobs take the P100s before the K80s, which
		// fits alone would offer alike.
		{"k80-p100-v100", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(12500)}}, {"fp32-ranked", []string{fpAtLeast(8000)}}, fits}},
		{"k80-p100-v100", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"fp32-top", []string{fpAtLeast(12500)}}, {"fp32-ranked", []string{fpAtLeast(8000)}}, fits}},
		// Every model publishes its bandwidth: {V100 898, P100 732} | 630 | K80
		// 240, no unranked model, no change.
		{"k80-p100-v100", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits}},
		// Economy's value tier is unchanged by unranked models.
		{"k80-p100-v100", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"fp32-top", []string{fpAtLeast(12500)}}, fits}},

		{"l4-only", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyPerformance, nil},
		{"l4-only", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, nil},
		{"l4-only", prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.PolicyPerformance, nil},

		// The demo's fleet: 16 GB compute-bound economy must reach the L4.
		{"demo-mixed", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"fp32-value", []string{fpAtLeast(25000), bwBelow(3150)}}, fits}},
		{"demo-mixed", prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.PolicyPerformance, []tierSpec{{"bandwidth-top", []string{bwAtLeast(3150)}}, {"bandwidth-second", []string{bwAtLeast(1600)}}, fits}},
		// The bench's fleet: the L40S leads FP32 outside the H100s, and no
		// H100 reaches its threshold, so the tier needs no upper bound on
		// bandwidth (and is a lower bound TierBoundsAsCapacity can write).
		{"h100-a100-l40s-l4", prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.PolicyEconomy, []tierSpec{{"fp32-value", []string{fpAtLeast(80000)}}, fits}},
	} {
		t.Run(tc.fleet+"/"+string(tc.bound)+"/"+string(tc.policy), func(t *testing.T) {
			in := oneGPU()
			out, plan, err := Rewrite(context.Background(), in, Profile{Name: "p", BoundType: tc.bound, Policy: tc.policy}, WithFleet(loadFleet(t, tc.fleet)))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Fleet == "" {
				t.Error("plan does not say which fleet figures chose the cut")
			}
			if tc.want == nil {
				if !equalSpecs(in, out) || len(plan.Rewritten) != 0 || len(plan.Untouched) != 1 {
					t.Errorf("want the claim unchanged, got %+v, plan %+v", out.Devices.Requests, plan)
				}
				return
			}
			got := readableLadder(t, out.Devices.Requests[0])
			if !slices.EqualFunc(got, tc.want, func(a, b tierSpec) bool { return a.name == b.name && slices.Equal(a.tests, b.tests) }) {
				t.Errorf("ladder\n got %v\nwant %v\nfleet %s", got, tc.want, plan.Fleet)
			}
		})
	}
}

// readableLadder is req's tiers, each with its tests in readable form.
func readableLadder(t *testing.T, req resourceapi.DeviceRequest) []tierSpec {
	t.Helper()
	var out []tierSpec
	for _, sub := range req.FirstAvailable {
		ts := tierSpec{name: sub.Name}
		for _, e := range exprs(sub.Selectors) {
			ts.tests = append(ts.tests, readable(t, e))
		}
		out = append(out, ts)
	}
	return out
}

func oneGPU() *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name:    "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
}

// TestFleetPlanExplainsCut: the annotation names the figures that chose
// each tier, with the share of the fleet it takes.
func TestFleetPlanExplainsCut(t *testing.T) {
	_, plan, err := Rewrite(context.Background(), oneGPU(), Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound}, WithFleet(loadFleet(t, "h100-a100-l4")))
	if err != nil {
		t.Fatal(err)
	}
	ann, err := plan.Annotation()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`"fleet":"memoryBandwidthGBps: NVIDIA H100 80GB HBM3 3350 x16 | 3150 | NVIDIA A100-SXM4-40GB 1555 x32 | 1250 | NVIDIA L4 300 x64"`,
		`memoryBandwidthGBps >= 3150 GB/s: 1 of 3 models, 16 of 112 devices (NVIDIA H100 80GB HBM3)`,
		`memoryBandwidthGBps >= 1250 GB/s: 2 of 3 models, 48 of 112 devices`,
	} {
		if !strings.Contains(ann, want) {
			t.Errorf("annotation lacks %s:\n%s", want, ann)
		}
	}
}

// TestFleetFollowsChanges: the same profile on a fleet that gained a
// faster model is cut anew.
func TestFleetFollowsChanges(t *testing.T) {
	f := loadFleet(t, "t4-p100-v100-a10")
	p := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound}
	before, _, err := Rewrite(context.Background(), oneGPU(), p, WithFleet(f))
	if err != nil {
		t.Fatal(err)
	}
	f.Models = append(f.Models, Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 67000})
	after, _, err := Rewrite(context.Background(), oneGPU(), p, WithFleet(f))
	if err != nil {
		t.Fatal(err)
	}
	first := func(s *resourceapi.ResourceClaimSpec) string {
		return readable(t, s.Devices.Requests[0].FirstAvailable[0].Selectors[0].CEL.Expression)
	}
	if first(before) != bwAtLeast(500) || first(after) != bwAtLeast(3150) {
		t.Errorf("top tier before and after an H100 joined: %s, %s; want %s, %s", first(before), first(after), bwAtLeast(500), bwAtLeast(3150))
	}
}

// TestFleetEdgeCases: fleets that give no ranking leave claims alone
// rather than guessing.
func TestFleetEdgeCases(t *testing.T) {
	for name, f := range map[string]*Fleet{
		"nil":                  nil,
		"empty":                {},
		"no figures published": {Models: []Model{{Name: "a", Devices: 4}, {Name: "b", Devices: 4}}},
		"two models, 10 % apart": {Models: []Model{
			{Name: "A100 80GB PCIe", Devices: 4, BandwidthGBps: 1935, FP32GFLOPS: 19500},
			{Name: "A100-SXM4-80GB", Devices: 4, BandwidthGBps: 2039, FP32GFLOPS: 19500},
		}},
	} {
		for _, b := range []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound} {
			in := oneGPU()
			out, plan, err := Rewrite(context.Background(), in, Profile{Name: "p", BoundType: b}, WithFleet(f))
			if err != nil || !equalSpecs(in, out) || len(plan.Rewritten) != 0 {
				t.Errorf("%s, %s: want the claim unchanged, got %v, %+v", name, b, err, plan)
			}
		}
	}
}

// TestFleetSelectorsBounded draws random fleets from the GPU table and
// counts the threshold selectors they make Rewrite emit: few per fleet, so
// one cluster's claims share a handful of compiled programs.
func TestFleetSelectorsBounded(t *testing.T) {
	skus := loadSKUs(t)
	var all []Model
	for _, s := range skus {
		all = append(all, Model{Name: s.ProductName, Devices: 8, BandwidthGBps: s.MemoryBandwidthGBps, FP32GFLOPS: s.FP32GFLOPS})
	}
	slices.SortFunc(all, func(a, b Model) int { return strings.Compare(a.Name, b.Name) })
	rnd := rand.New(rand.NewPCG(17, 1))
	worst := 0
	for range 200 {
		f := &Fleet{}
		for _, m := range all {
			if rnd.IntN(2) == 0 {
				f.Models = append(f.Models, m)
			}
		}
		used := map[string]bool{}
		for _, b := range []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound} {
			for _, p := range []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy} {
				out, _, err := Rewrite(context.Background(), oneGPU(), Profile{Name: "p", BoundType: b, Policy: p}, WithFleet(f))
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range out.Devices.Requests {
					for _, sub := range r.FirstAvailable {
						for _, s := range sub.Selectors {
							used[s.CEL.Expression] = true
						}
					}
				}
			}
		}
		worst = max(worst, len(used))
	}
	t.Logf("at most %d distinct threshold selectors for one fleet", worst)
	if worst > 8 || worst == 0 {
		t.Errorf("one fleet used %d distinct threshold selectors, want 1..8", worst)
	}
}

// BenchmarkRewriteFleet compares the admission cost of cutting the ladder
// from a fleet (every claim, 9 models) with the built-in ladders, in the
// same run: go test -bench RewriteFleet ./pkg/rewrite.
func BenchmarkRewriteFleet(b *testing.B) {
	skus := loadSKUs(b)
	f := &Fleet{}
	for _, s := range skus {
		f.Models = append(f.Models, Model{Name: s.ProductName, Devices: 8, BandwidthGBps: s.MemoryBandwidthGBps, FP32GFLOPS: s.FP32GFLOPS})
	}
	load := &Load{Free: map[string]int{}, Pending: make([]Pending, 100)}
	p := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy}
	// The catalogue compiles once per process; keep that out of the first
	// case.
	if _, err := verifiedSelector(0); err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name string
		opts []Option
		p    Profile
	}{
		{"built-in", nil, p},
		{"fleet", []Option{WithFleet(f)}, p},
		{"load-aware, 100 pending", []Option{WithFleet(f), WithLoad(load)}, Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyLoadAware}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if _, _, err := Rewrite(context.Background(), oneGPU(), bc.p, bc.opts...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestFleetCutHoldsTheWorkload: models too small for the memory floor take
// no part in the cut, and hard needs are kept even where the fleet offers
// no preference.
func TestFleetCutHoldsTheWorkload(t *testing.T) {
	gi := func(n int64) *resource.Quantity { return resource.NewQuantity(n<<30, resource.BinarySI) }
	for _, tc := range []struct {
		name    string
		fleet   string
		profile Profile
		want    []tierSpec
	}{
		// 20 GiB measured needs the 39 GiB floor: the L4s (24 GB) cannot
		// be economy's choice; the A100 is at 29 % of the H100's FP32.
		{"compute-bound economy skips the L4s it does not fit", "h100-a100-l4",
			Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: gi(20)}, []tierSpec{{"fp32-top", []string{fpAtLeast(63000)}}, {name: "fits"}}},
		// 60 GiB needs the 79 GiB floor: only the H100s hold it, so there is
		// no choice left, but the floor stays.
		{"only one model holds it: hard needs only", "h100-a100-l4",
			Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: gi(60)}, []tierSpec{{name: "fits"}}},
		{"a single-model fleet keeps the hard needs", "l4-only",
			Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: gi(10)}, []tierSpec{{name: "fits"}}},
		{"no model holds it: hard needs only, so it waits rather than runs out of memory", "l4-only",
			Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: gi(30)}, []tierSpec{{name: "fits"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.profile.Name = "p"
			out, plan, err := Rewrite(context.Background(), oneGPU(), tc.profile, WithFleet(loadFleet(t, tc.fleet)))
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Rewritten) != 1 {
				t.Fatalf("claim not rewritten: %+v", plan)
			}
			var got []tierSpec
			for _, sub := range out.Devices.Requests[0].FirstAvailable {
				ts := tierSpec{name: sub.Name}
				tests := exprs(sub.Selectors)
				for _, e := range tests {
					if !strings.Contains(e, `"memory" in`) {
						ts.tests = append(ts.tests, readable(t, e))
					}
				}
				got = append(got, ts)
				if !slices.ContainsFunc(tests, func(e string) bool { return strings.Contains(e, `"memory" in`) }) {
					t.Errorf("tier %s lost the memory floor", sub.Name)
				}
			}
			if !slices.EqualFunc(got, tc.want, func(a, b tierSpec) bool { return a.name == b.name && slices.Equal(a.tests, b.tests) }) {
				t.Errorf("ladder\n got %v\nwant %v\nfleet %s", got, tc.want, plan.Fleet)
			}
		})
	}
}
