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
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

const (
	v100 = "Tesla V100-SXM2-16GB"
	p100 = "Tesla P100-PCIE-16GB"
	a10  = "NVIDIA A10"
)

// ran is a usage profile whose runs on whole GPUs took the given busy
// seconds per model, each over runs runs.
func ran(runs int32, busySeconds map[string]int64) *prismv1alpha1.UsageProfile {
	u := &prismv1alpha1.UsageProfile{Runs: runs}
	for _, name := range []string{v100, p100, a10} {
		if s, ok := busySeconds[name]; ok {
			u.Models = append(u.Models, prismv1alpha1.ModelUsage{ProductName: name, Runs: runs, BusyMilliseconds: s * 1000})
		}
	}
	return u
}

// TestMeasuredRunsSplitAClass: a model the workload's own runs took at
// least 1.3x less GPU time on leads the ladder, where the published figure
// put it in one class with slower ones and a threshold separates them.
func TestMeasuredRunsSplitAClass(t *testing.T) {
	fits := tierSpec{name: "fits"}
	memory, compute := prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound
	measured := func(v int64) tierSpec { return tierSpec{"bandwidth-measured", []string{bwAtLeast(v)}} }
	for _, tc := range []struct {
		name   string
		fleet  string
		bound  prismv1alpha1.BoundType
		policy prismv1alpha1.Policy
		usage  *prismv1alpha1.UsageProfile
		want   []tierSpec // nil: claim unchanged
	}{{
		name: "no runs: the class as published", fleet: "k80-p100-v100", bound: memory,
		want: []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		// Gavel's memory-bound jobs: 1.8x faster on the V100.
		name: "1.8x less on the V100: it leads", fleet: "k80-p100-v100", bound: memory,
		usage: ran(2, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{measured(800), {"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "one run on each is not enough", fleet: "k80-p100-v100", bound: memory,
		usage: ran(1, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "1.2x is within what runs vary by", fleet: "k80-p100-v100", bound: memory,
		usage: ran(2, map[string]int64{v100: 100, p100: 120}),
		want:  []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "faster on the model with less bandwidth: no threshold says so", fleet: "k80-p100-v100", bound: memory,
		usage: ran(2, map[string]int64{v100: 180, p100: 100}),
		want:  []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "economy keeps the top class free whatever the runs say", fleet: "k80-p100-v100", bound: memory, policy: prismv1alpha1.PolicyEconomy,
		usage: ran(2, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{{"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "load-aware without a load takes performance's ladder", fleet: "k80-p100-v100", bound: memory, policy: prismv1alpha1.PolicyLoadAware,
		usage: ran(2, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{measured(800), {"bandwidth-top", []string{bwAtLeast(630)}}, fits},
	}, {
		name: "the V100 alone holds the top FP32 class: nothing to split", fleet: "k80-p100-v100", bound: compute,
		usage: ran(2, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{{"fp32-top", []string{fpAtLeast(12500)}}, {"fp32-ranked", []string{fpAtLeast(8000)}}, fits},
	}, {
		// V100 900, P100 732, A10 600 GB/s are one class. The largest step
		// is below the P100.
		name: "split where the step is", fleet: "t4-p100-v100-a10", bound: memory,
		usage: ran(2, map[string]int64{v100: 100, p100: 110, a10: 300}),
		want:  []tierSpec{measured(630), {"bandwidth-top", []string{bwAtLeast(500)}}, fits},
	}, {
		name: "a model with a higher figure that never ran joins the faster side", fleet: "t4-p100-v100-a10", bound: memory,
		usage: ran(2, map[string]int64{p100: 100, a10: 200}),
		want:  []tierSpec{measured(630), {"bandwidth-top", []string{bwAtLeast(500)}}, fits},
	}, {
		name: "a fleet of one class gets a ladder from the runs alone", fleet: "p100-v100", bound: memory,
		usage: ran(2, map[string]int64{v100: 100, p100: 180}),
		want:  []tierSpec{measured(800), fits},
	}, {
		name: "and none without them", fleet: "p100-v100", bound: memory,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			in := oneGPU()
			fleet := &Fleet{}
			if tc.fleet == "p100-v100" {
				for _, m := range loadFleet(t, "k80-p100-v100").Models {
					if m.Name != "Tesla K80" {
						fleet.Models = append(fleet.Models, m)
					}
				}
			} else {
				fleet = loadFleet(t, tc.fleet)
			}
			out, plan, err := Rewrite(context.Background(), in, Profile{Name: "p", BoundType: tc.bound, Policy: tc.policy, Usage: tc.usage}, WithFleet(fleet))
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == nil {
				if !equalSpecs(in, out) {
					t.Errorf("want the claim unchanged, got %+v", out.Devices.Requests)
				}
				return
			}
			if diff := cmp.Diff(tc.want, readableLadder(t, out.Devices.Requests[0]), cmp.AllowUnexported(tierSpec{})); diff != "" {
				t.Errorf("ladder (-want +got):\n%s\nplan %+v", diff, plan)
			}
		})
	}
}

// TestMeasuredTierSaysWhy: the plan names the runs that chose the tier.
func TestMeasuredTierSaysWhy(t *testing.T) {
	_, plan, err := Rewrite(context.Background(), oneGPU(),
		Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, Usage: ran(3, map[string]int64{v100: 100, p100: 180})},
		WithFleet(loadFleet(t, "k80-p100-v100")))
	if err != nil {
		t.Fatal(err)
	}
	ann, err := plan.Annotation()
	if err != nil {
		t.Fatal(err)
	}
	want := "memoryBandwidthGBps >= 800 GB/s: " + v100 + "; the workload's runs took 1.8x less GPU time on " + v100 + " than on " + p100
	if !strings.Contains(ann, want) {
		t.Errorf("plan does not say why the measured tier leads; want %q in\n%s", want, ann)
	}
}
