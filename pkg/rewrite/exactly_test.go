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
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// exactlyView is what a rewrite for a scheduler that counts only exactly
// requests decides, less what any rewrite decides.
type exactlyView struct {
	NoLadder    string
	Rewritten   []string
	Untouched   []Untouched
	MemoryFloor string
	// Steps says whether the plan has a share or a partition step.
	Steps bool
}

func viewOf(p *Plan) exactlyView {
	return exactlyView{NoLadder: p.NoLadder, Rewritten: p.Rewritten, Untouched: p.Untouched, MemoryFloor: p.MemoryFloor.String(), Steps: p.Share != nil || p.Partition != nil}
}

// TestExactlyOnly: for a pod whose scheduler counts only exactly requests,
// the claim gets no firstAvailable list, no share, no partition and no
// capacity request; an eligible request keeps its exactly form with the
// hard needs as a CEL selector ahead of the user's, and the plan says why.
// Where there was no ladder to write, the plan is as for any pod.
func TestExactlyOnly(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	const kai = "kai-scheduler"
	noLadder := "kai-scheduler counts only exactly requests (NVIDIA/KAI-Scheduler#900)"
	needs, err := joined([]string{memoryAtLeast(22), ccAtLeast(8, 0)})
	if err != nil {
		t.Fatal(err)
	}
	measured := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("16Gi"), MinComputeCapability: "8.0", Usage: usage(20, "6Gi")}
	// Without ExactlyOnly this cluster offers the profile a share first, a
	// partition, and the memory floor and tier bounds as capacity requests.
	everything := Cluster{Capacity: Capacity{Shares: true, MemoryFloor: true, TierBounds: true, Why: "the API server keeps capacity requests"}, Partitions: true, ExactlyOnly: kai}
	firstAvailable := resourceapi.DeviceRequest{Name: "mine", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
	nic := exactGPU("nic", 1)
	nic.Exactly.DeviceClassName = "nic.example.com"
	for _, tc := range []struct {
		name     string
		profile  Profile
		cluster  Cluster
		in, want []resourceapi.DeviceRequest
		plan     exactlyView
	}{
		{
			name: "hard needs, nothing else", profile: measured, cluster: everything,
			in:   []resourceapi.DeviceRequest{exactGPU("gpu", 2, userSelector)},
			want: []resourceapi.DeviceRequest{exactGPU("gpu", 2, needs, userSelector)},
			plan: exactlyView{NoLadder: noLadder, Rewritten: []string{"gpu"}, MemoryFloor: "cel: kai-scheduler allocates without checking capacity requests"},
		},
		{
			name: "a custom name, no capacity asked for", profile: measured, cluster: Cluster{ExactlyOnly: "kai-shard-a"},
			in:   []resourceapi.DeviceRequest{exactGPU("gpu", 1)},
			want: []resourceapi.DeviceRequest{exactGPU("gpu", 1, needs)},
			plan: exactlyView{NoLadder: "kai-shard-a counts only exactly requests (NVIDIA/KAI-Scheduler#900)", Rewritten: []string{"gpu"}},
		},
		{
			name: "no hard needs", profile: Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy}, cluster: everything,
			in:   []resourceapi.DeviceRequest{exactGPU("gpu", 1, userSelector)},
			want: []resourceapi.DeviceRequest{exactGPU("gpu", 1, userSelector)},
			plan: exactlyView{NoLadder: noLadder, Untouched: []Untouched{{Request: "gpu", Reason: "no ladder, and the profile has no hard needs to add"}}},
		},
		{
			name: "other requests as for any pod", profile: measured, cluster: everything,
			in:   []resourceapi.DeviceRequest{nic, firstAvailable, exactGPU("gpu", 1)},
			want: []resourceapi.DeviceRequest{nic, firstAvailable, exactGPU("gpu", 1, needs)},
			plan: exactlyView{NoLadder: noLadder, Rewritten: []string{"gpu"}, MemoryFloor: "cel: kai-scheduler allocates without checking capacity requests", Untouched: []Untouched{
				{Request: "nic", Reason: "device class is not gpu.prism.dev"},
				{Request: "mine", Reason: "already a firstAvailable list: the user's order is kept as written"},
			}},
		},
		{
			name: "no eligible request: no reason to give", profile: measured, cluster: everything,
			in:   []resourceapi.DeviceRequest{firstAvailable},
			want: []resourceapi.DeviceRequest{firstAvailable},
			plan: exactlyView{Untouched: []Untouched{{Request: "mine", Reason: "already a firstAvailable list: the user's order is kept as written"}}},
		},
		{
			name: "balanced with usage: no share without a ladder", profile: Profile{BoundType: prismv1alpha1.BoundTypeBalanced, Usage: usage(20, "6Gi")}, cluster: everything,
			in:   []resourceapi.DeviceRequest{exactGPU("gpu", 1)},
			want: []resourceapi.DeviceRequest{exactGPU("gpu", 1)},
			plan: exactlyView{Untouched: []Untouched{{Request: "gpu", Reason: "bound type Balanced: no hardware preference to express"}}},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := gpuSpec(tc.in...)
			out, plan, err := Rewrite(ctx, in, tc.profile, tc.cluster)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(gpuSpec(tc.want...), out); diff != "" {
				t.Errorf("claim (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.plan, viewOf(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(gpuSpec(tc.in...), in); diff != "" {
				t.Errorf("input modified (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExactlyOnlyKeepsTheAffinityDecision: in affinity mode the pod's
// preferred terms are decided as for any pod (the pod webhook decides them
// without the claim); only the claim's one-tier list becomes the exactly
// request with the hard needs.
func TestExactlyOnlyKeepsTheAffinityDecision(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	profile := Profile{Name: "stream", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("30Gi")}
	cluster := Cluster{Preference: PreferAffinity, FleetKnown: true, Fleet: e2eFleet(0)}
	_, ladderPlan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), profile, cluster)
	if err != nil {
		t.Fatal(err)
	}
	cluster.ExactlyOnly = "kai-scheduler"
	out, plan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), profile, cluster)
	if err != nil {
		t.Fatal(err)
	}
	if ladderPlan.Preference == nil || ladderPlan.Preference.Mode != PreferAffinity {
		t.Fatalf("the fixture should decide for affinity: %+v", ladderPlan.Preference)
	}
	if diff := cmp.Diff(ladderPlan.Preference, plan.Preference); diff != "" {
		t.Errorf("preference (-any pod +exactly only):\n%s", diff)
	}
	if diff := cmp.Diff(gpuSpec(exactGPU("gpu", 1, memoryAtLeast(39))), out); diff != "" {
		t.Errorf("claim (-want +got):\n%s", diff)
	}
}
