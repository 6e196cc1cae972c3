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
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestClusterIsEveryOption: a Cluster passed as one value rewrites a claim
// as the options that set its fields one by one do, and a later option
// changes only its own field.
func TestClusterIsEveryOption(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	fleet := e2eFleet(0)
	fleet.Models[0].FigureCapacityDevices = fleet.Models[0].Devices
	profile := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi"), Usage: usage(32, "6Gi")}
	cluster := Cluster{Capacity: Capacity{Shares: true, MemoryFloor: true, TierBounds: true}, Preference: PreferLadder, Partitions: true, FleetKnown: true, Fleet: fleet}
	for _, tc := range []struct {
		name          string
		cluster, opts []Option
	}{
		{"every field", []Option{cluster},
			[]Option{ShareFromUsage(), MemoryFloorAsCapacity(), TierBoundsAsCapacity(), WithPreference(PreferLadder), PartitionsFromUsage(), WithFleet(fleet)}},
		{"an option after the cluster", []Option{cluster, WithPreference(PreferAffinity)},
			[]Option{ShareFromUsage(), MemoryFloorAsCapacity(), TierBoundsAsCapacity(), WithPreference(PreferAffinity), PartitionsFromUsage(), WithFleet(fleet)}},
		{"the cluster replaces the options before it", []Option{WithPreference(PreferAffinity), cluster},
			[]Option{ShareFromUsage(), MemoryFloorAsCapacity(), TierBoundsAsCapacity(), WithPreference(PreferLadder), PartitionsFromUsage(), WithFleet(fleet)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := gpuSpec(exactGPU("gpu", 1), exactGPU("pair", 2))
			wantSpec, wantPlan, err := Rewrite(ctx, spec, profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			gotSpec, gotPlan, err := Rewrite(ctx, spec, profile, tc.cluster...)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(wantSpec, gotSpec); diff != "" {
				t.Errorf("rewritten claim (-options +cluster):\n%s", diff)
			}
			if diff := cmp.Diff(wantPlan, gotPlan); diff != "" {
				t.Errorf("plan (-options +cluster):\n%s", diff)
			}
		})
	}
}

// TestPlanSaysItWasSizedFromUsage: a profile's usage that sized a share
// on offer, as a share or a partition, is what the plan says it rests on,
// taken or not; the capacity decision is in the plan where it has a why.
func TestPlanSaysItWasSizedFromUsage(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	partitioned := &Fleet{Models: []Model{{Name: "NVIDIA A100-SXM4-80GB", Devices: 1, MemoryBytes: 80 << 30, Multiprocessors: 108}},
		Partitions: []PartitionModel{{Model: "NVIDIA A100-SXM4-80GB", Profile: "1g.10gb", Devices: 7, MemoryBytes: 10 << 30, Multiprocessors: 14}}}
	measured := Profile{Name: "p", Usage: usage(32, "6Gi")}
	shares := Cluster{Capacity: Capacity{Shares: true, Why: "the API server keeps capacity requests, and --memory-floor=cel"}}
	for _, tc := range []struct {
		name    string
		profile Profile
		// requests are the claim's, each for one GPU but "pair", for two.
		requests     []string
		cluster      Cluster
		want         bool
		wantCapacity string
	}{
		{"a share on offer", measured, []string{"gpu"}, shares, true, "cel: the API server keeps capacity requests, and --memory-floor=cel"},
		{"a share no request takes", measured, []string{"pair"}, shares, true, "cel: the API server keeps capacity requests, and --memory-floor=cel"},
		{"a partition on offer", measured, []string{"gpu"}, Cluster{Partitions: true, FleetKnown: true, Fleet: partitioned}, true, ""},
		{"neither on offer", measured, []string{"gpu"}, Cluster{}, false, ""},
		{"the profile says Exclusive", Profile{Name: "p", Usage: usage(32, "6Gi"), Exclusive: true}, []string{"gpu"}, shares, false, "cel: the API server keeps capacity requests, and --memory-floor=cel"},
		{"heavy", Profile{Name: "p", Usage: usage(70, "6Gi")}, []string{"gpu"}, shares, false, "cel: the API server keeps capacity requests, and --memory-floor=cel"},
		{"no usage", Profile{Name: "p"}, []string{"gpu"}, shares, false, "cel: the API server keeps capacity requests, and --memory-floor=cel"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := gpuSpec()
			for _, r := range tc.requests {
				count := int64(1)
				if r == "pair" {
					count = 2
				}
				spec.Devices.Requests = append(spec.Devices.Requests, exactGPU(r, count))
			}
			_, plan, err := Rewrite(ctx, spec, tc.profile, tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			if plan.SizedFromUsage != tc.want {
				t.Errorf("SizedFromUsage %v, want %v (share %+v, partition %+v)", plan.SizedFromUsage, tc.want, plan.Share, plan.Partition)
			}
			if diff := cmp.Diff(tc.wantCapacity, plan.Capacity.String()); diff != "" {
				t.Errorf("plan's capacity (-want +got):\n%s", diff)
			}
		})
	}
}
