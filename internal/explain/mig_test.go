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

package explain

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/explain/explaintest"
)

// holding is a claim ns/name allocated device of the MIG node.
func holding(name, device string) resourceapi.ResourceClaim {
	return resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: explaintest.MIGNode, Device: device}},
		}}},
	}
}

// An A100-40GB publishes 25 partitions on 8 memory slices. Which are free
// follows from the counters held devices consume: a partition held blocks
// the whole GPU and every partition on its slices; the whole GPU held
// blocks every partition.
func TestFleetFoldsPartitionsIntoTheirGPU(t *testing.T) {
	resourceSlices := explaintest.MIGSlices(t)
	for _, tc := range []struct {
		name   string
		claims []resourceapi.ResourceClaim
		want   MIG
		whole  []string
	}{
		{name: "nothing held", want: MIG{Partitions: 25, Free: 25, MemorySlices: 8}},
		{name: "one 3g.20gb held", claims: []resourceapi.ResourceClaim{holding("job-a", explaintest.PartitionA)},
			// Left free: what fits in slices 4-7, 1g.5gb and 1g.5gb+me
			// at 4, 5 and 6, 1g.10gb at 4 and 6, 2g.10gb and 3g.20gb at 4.
			want: MIG{Partitions: 25, Free: 10, MemorySlices: 8, MemorySlicesHeld: 4, Held: []Partition{
				{Device: explaintest.PartitionA, Label: "3g.20gb@0", HeldBy: []Holder{{Namespace: "ml", Name: "job-a", Request: "gpu"}}},
			}}},
		{name: "two 3g.20gb held", claims: explaintest.MIGClaims(),
			want: MIG{Partitions: 25, Free: 0, MemorySlices: 8, MemorySlicesHeld: 8, Held: []Partition{
				{Device: explaintest.PartitionA, Label: "3g.20gb@0", HeldBy: []Holder{{Namespace: "ml", Name: "job-a", Request: "gpu", Pods: []string{"job-a-0"}}}},
				{Device: explaintest.PartitionB, Label: "3g.20gb@4", HeldBy: []Holder{{Namespace: "ml", Name: "job-b", Request: "gpu", Pods: []string{"job-b-0"}}}},
			}}},
		{name: "whole GPU held", claims: []resourceapi.ResourceClaim{holding("train", "gpu-0")},
			want: MIG{Partitions: 25, Free: 0, MemorySlices: 8, MemorySlicesHeld: 8}, whole: []string{"ml/train"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := Fleet(resourceSlices, Holders(tc.claims))
			var devices []string
			for _, g := range gpus {
				devices = append(devices, g.Device)
			}
			if diff := cmp.Diff([]string{"gpu-0", "gpu-1"}, devices); diff != "" {
				t.Fatalf("rows (-want +got):\n%s", diff)
			}
			if gpus[1].MIG != nil {
				t.Errorf("gpu-1, not in MIG mode, has MIG %+v", *gpus[1].MIG)
			}
			if gpus[0].MIG == nil {
				t.Fatal("gpu-0 in MIG mode has no MIG")
			}
			if diff := cmp.Diff(tc.want, *gpus[0].MIG); diff != "" {
				t.Errorf("gpu-0 MIG (-want +got):\n%s", diff)
			}
			var whole []string
			for _, h := range gpus[0].HeldBy {
				whole = append(whole, h.Claim())
			}
			if diff := cmp.Diff(tc.whole, whole); diff != "" {
				t.Errorf("gpu-0 held whole by (-want +got):\n%s", diff)
			}
		})
	}
}

// A device that shares counters with another claim's device says which
// memory slices that claim holds, or, where they do not overlap, which
// other counters run out (2g.10gb@2 beside two 3g.20gb: 28+42+42 SMs of
// 98); the claim's own allocation blocks nothing for it.
func TestExplainSaysWhichSlicesBlockAPartition(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	resourceSlices := explaintest.MIGSlices(t)
	claims := explaintest.MIGClaims()
	class := resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: gpuv1alpha1.DriverName}}
	anyDevice := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "job-c", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuv1alpha1.DriverName},
		}}}},
	}
	selectorRejects := "rejected: " + explaintest.ProfileSelector("3g.20gb").CEL.Expression
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  map[string]string // device: verdict
	}{
		{name: "another claim", claim: anyDevice, want: map[string]string{
			"gpu-0":                "matches gpu, but memory slices 0-3 held by ml/job-a's 3g.20gb; memory slices 4-7 held by ml/job-b's 3g.20gb",
			"gpu-0-mig-2g10gb-2":   "matches gpu, but memory slices 2-3 held by ml/job-a's 3g.20gb; too few copy-engines, multiprocessors left beside ml/job-b's 3g.20gb",
			"gpu-0-mig-1g5gb-me-6": "matches gpu, but memory slice 6 held by ml/job-b's 3g.20gb",
			explaintest.PartitionA: "matches gpu, but ml/job-a holds it",
			"gpu-1":                "matches gpu",
		}},
		{name: "a claim holding a partition", claim: &claims[0], want: map[string]string{
			"gpu-0":              selectorRejects,
			"gpu-0-mig-1g5gb-2":  selectorRejects,
			"gpu-0-mig-3g20gb-0": "matches gpu",
			"gpu-0-mig-3g20gb-4": "matches gpu, but ml/job-b holds it",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rows := Explain(ctx, tc.claim, resourceSlices, []resourceapi.DeviceClass{class}, Holders(claims))
			got := make(map[string]string)
			for _, r := range rows {
				if _, ok := tc.want[r.Device]; ok {
					got[r.Device] = r.Verdict
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdicts (-want +got):\n%s", diff)
			}
		})
	}
}
