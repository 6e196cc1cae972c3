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

package fleet

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestTrimPod: the Pod informer keeps of each pod its identity and the
// claims made for it, nothing of its spec, and a view fed trimmed pods
// counts the same claims as one fed whole pods.
func TestTrimPod(t *testing.T) {
	whole := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "alice", Name: "job-0", UID: "job-0-uid", ResourceVersion: "7",
			Labels: map[string]string{"app": "train"}, Annotations: map[string]string{"note": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "main", Image: "train:1", Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims: []corev1.PodResourceClaim{
				{Name: "gpu", ResourceClaimTemplateName: ptr.To("gpu-template")},
				{Name: "nic", ResourceClaimTemplateName: ptr.To("nic-template")},
				{Name: "shared", ResourceClaimName: ptr.To("by-hand")},
			},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodPending,
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/5000 nodes are available"}},
			ResourceClaimStatuses: []corev1.PodResourceClaimStatus{
				{Name: "gpu", ResourceClaimName: ptr.To("job-0-gpu-x7k2p")},
				// A template that made no claim.
				{Name: "nic"},
			},
		},
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "alice", Name: "job-0", UID: "job-0-uid", ResourceVersion: "7"},
		Status:     corev1.PodStatus{ResourceClaimStatuses: []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("job-0-gpu-x7k2p")}}},
	}
	got, err := TrimPod(whole.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimmed pod (-want +got):\n%s", diff)
	}

	claim := unused("alice", "job-0-gpu-x7k2p", "", 2)
	for _, tc := range []struct {
		name string
		pod  any
	}{
		{"whole", whole},
		{"trimmed", got},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			v.OnAdd(gpus("node-a", 8), true)
			v.OnAdd(tc.pod, true)
			v.OnAdd(ofPod(claim.DeepCopy(), "job-0"), true)
			if diff := cmp.Diff([]rewrite.Pending{{Devices: 2}}, v.Load().Pending, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("pending claims (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUnscheduledPods: the informer holds pods no node runs yet and that
// have not ended, the only ones whose claims can wait.
func TestUnscheduledPods(t *testing.T) {
	for _, tc := range []struct {
		name     string
		nodeName string
		phase    corev1.PodPhase
		want     bool
	}{
		{"waits for the scheduler", "", corev1.PodPending, true},
		{"bound to a node", "node-a", corev1.PodPending, false},
		{"runs", "node-a", corev1.PodRunning, false},
		{"failed before it was scheduled", "", corev1.PodFailed, false},
		{"succeeded", "node-a", corev1.PodSucceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := UnscheduledPods().Matches(fields.Set{"spec.nodeName": tc.nodeName, "status.phase": string(tc.phase)})
			if got != tc.want {
				t.Errorf("selected: got %v, want %v", got, tc.want)
			}
		})
	}
}
