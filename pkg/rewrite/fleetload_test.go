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
	"slices"
	"strings"
	"testing"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestLoadAware pins the load-aware decision on the demo's fleet: H100
// 3350 GB/s, 67 TFLOPS; A100 80GB PCIe 1935 GB/s, 19.5 TFLOPS; L4 300 GB/s,
// 30.3 TFLOPS; T4 320 GB/s, 8.1 TFLOPS. A memory-bound job runs 3350/1935 =
// 1.73x faster on the H100 than on the best card outside it; a
// compute-bound one 67/30.3 = 2.21x.
func TestLoadAware(t *testing.T) {
	const h100 = "NVIDIA H100 80GB HBM3"
	take := []tierSpec{{"bandwidth-top", []string{bwAtLeast(3150)}}, {"bandwidth-second", []string{bwAtLeast(1600)}}, {name: "fits"}}
	yield := []tierSpec{{"bandwidth-yield", []string{bwAtLeast(1600), bwBelow(3150)}}, {name: "fits"}}
	for _, tc := range []struct {
		name     string
		bound    prismv1alpha1.BoundType
		devices  int64
		load     *Load
		want     []tierSpec
		decision string
	}{
		{"no load known: performance", prismv1alpha1.BoundTypeMemoryBound, 1, nil, take, "performance: no load known"},
		{"H100s free, nobody waiting: takes one", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 2}}, take, "takes NVIDIA H100 80GB HBM3: 2 free"},
		{"a multi-GPU claim waits for more than is free: a single GPU yields", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 2}, Pending: []Pending{{Devices: 4}}}, yield, "yields NVIDIA H100 80GB HBM3: 4 devices of multi-GPU claims pending, 2 free"},
		{"a multi-GPU job does not yield to another", prismv1alpha1.BoundTypeMemoryBound, 2,
			&Load{Free: map[string]int{h100: 2}, Pending: []Pending{{Devices: 4}}}, take, "takes"},
		{"enough free for the multi-GPU claims and this one: takes one", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 5}, Pending: []Pending{{Devices: 4}}}, take, "takes"},
		{"compute-bound claims gain more from the H100: memory-bound yields", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 1}, Pending: []Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeComputeBound}}}, yield, "yields NVIDIA H100 80GB HBM3: 1 devices pending for claims that gain more there (this job x1.73), 1 free"},
		{"memory-bound claims of the same gain do not push it out", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 1}, Pending: []Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeMemoryBound}, {Devices: 1, BoundType: prismv1alpha1.BoundTypeMemoryBound}}}, take, "takes"},
		{"more free than the claims that gain more need: takes one", prismv1alpha1.BoundTypeMemoryBound, 1,
			&Load{Free: map[string]int{h100: 2}, Pending: []Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeComputeBound}}}, take, "takes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := oneGPU()
			spec.Devices.Requests[0].Exactly.Count = tc.devices
			opts := []Option{WithFleet(loadFleet(t, "demo-mixed"))}
			if tc.load != nil {
				opts = append(opts, WithLoad(tc.load))
			}
			out, plan, err := Rewrite(context.Background(), spec, Profile{Name: "p", BoundType: tc.bound, Policy: prismv1alpha1.PolicyLoadAware}, opts...)
			if err != nil {
				t.Fatal(err)
			}
			got := readableLadder(t, out.Devices.Requests[0])
			if !slices.EqualFunc(got, tc.want, func(a, b tierSpec) bool { return a.name == b.name && slices.Equal(a.tests, b.tests) }) {
				t.Errorf("ladder\n got %v\nwant %v", got, tc.want)
			}
			if !strings.HasPrefix(plan.Load, tc.decision) {
				t.Errorf("plan.load %q, want it to start with %q", plan.Load, tc.decision)
			}
		})
	}
}

// TestLoadAwareWithoutFleet: the policy is valid everywhere and falls back
// to performance where nothing is known.
func TestLoadAwareWithoutFleet(t *testing.T) {
	out, plan, err := Rewrite(context.Background(), oneGPU(), Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyLoadAware})
	if err != nil {
		t.Fatal(err)
	}
	if first := out.Devices.Requests[0].FirstAvailable[0].Name; first != "ultra" || plan.Load != "performance: no fleet known" {
		t.Errorf("without a fleet: first tier %s, load %q; want the built-in performance ladder", first, plan.Load)
	}
}

// TestLoadAwareLatencyBound: a latency-bound job prefers the fastest class
// as any other does, and gives it up only while a waiting claim needs it.
func TestLoadAwareLatencyBound(t *testing.T) {
	fleet := loadFleet(t, "demo-mixed")
	latency := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyLoadAware}
	for _, tc := range []struct {
		name  string
		load  *Load
		first string
	}{
		{"nothing pending: the top class", &Load{}, "fp32-top"},
		{"a multi-GPU claim pending: yields", &Load{Pending: []Pending{{Devices: 8}}}, "fp32-yield"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := Rewrite(context.Background(), oneGPU(), latency, WithFleet(fleet), WithLoad(tc.load))
			if err != nil {
				t.Fatal(err)
			}
			if got := out.Devices.Requests[0].FirstAvailable[0].Name; got != tc.first {
				t.Errorf("first tier %s, want %s", got, tc.first)
			}
		})
	}
}
