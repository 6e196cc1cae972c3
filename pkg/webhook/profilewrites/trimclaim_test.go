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

package profilewrites

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestTrimClaimKeepsThePodOwner: the fleet view counts a waiting claim
// only when a pod's template made it, so the informer keeps, of a waiting
// claim's owners, the pod that controls it, and nothing else.
func TestTrimClaimKeepsThePodOwner(t *testing.T) {
	pod := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "job-0", UID: "job-0-uid", Controller: ptr.To(true)}
	notController := pod
	notController.Controller = nil
	replicaSet := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: ptr.To(true)}
	owner := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Job", Name: "j", UID: "j-uid"}
	claim := func(owners []metav1.OwnerReference, allocated bool) *resourceapi.ResourceClaim {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "alice", UID: "c-uid", OwnerReferences: owners}}
		if allocated {
			c.Status.Allocation = &resourceapi.AllocationResult{}
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  []metav1.OwnerReference
	}{
		{"a waiting claim of a pod keeps the pod", claim([]metav1.OwnerReference{owner, pod}, false), []metav1.OwnerReference{pod}},
		{"a waiting claim made by hand has none", claim(nil, false), nil},
		{"a pod that does not control the claim is dropped", claim([]metav1.OwnerReference{notController}, false), nil},
		{"a controller other than a pod is dropped", claim([]metav1.OwnerReference{replicaSet}, false), nil},
		{"an allocated claim counts by its allocation, not its owner", claim([]metav1.OwnerReference{pod}, true), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := TrimClaim(tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, out.(*resourceapi.ResourceClaim).OwnerReferences, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("owner references (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTrimClaimKeepsOnlyAValidProfile: the informer caches every claim of
// the cluster, so it keeps the profile annotation only where it names a
// WorkloadProfile. A 200 KiB value made each claim cost about 257 KiB of
// the controller's memory, and a thousand such claims its 256 MiB limit.
func TestTrimClaimKeepsOnlyAValidProfile(t *testing.T) {
	for _, tc := range []struct {
		name, profile string
		want          string // the profile kept, "" for none
	}{
		{name: "a valid name is kept", profile: "train", want: "train"},
		{name: "the longest name is kept", profile: strings.Repeat("a", 253), want: strings.Repeat("a", 253)},
		{name: "one a byte too long is dropped", profile: strings.Repeat("a", 254)},
		{name: "200 KiB are dropped", profile: strings.Repeat("a", 200<<10)},
		{name: "upper case is dropped", profile: "Train"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, allocated := range []bool{false, true} {
				c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "alice", UID: "c-uid",
					Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: tc.profile, "pad": strings.Repeat("x", 1<<10)}}}
				if allocated {
					c.Status.Allocation = &resourceapi.AllocationResult{}
				}
				out, err := TrimClaim(c)
				if err != nil {
					t.Fatal(err)
				}
				kept := out.(*resourceapi.ResourceClaim).Annotations
				if got := kept[prismv1alpha1.ProfileAnnotation]; got != tc.want {
					t.Errorf("allocated %v: kept a profile of %d bytes (%.70q), want %q", allocated, len(got), got, tc.want)
				}
				n := 0
				for k, v := range kept {
					n += len(k) + len(v)
				}
				if limit := len(prismv1alpha1.ProfileAnnotation) + len(tc.want); n > limit {
					t.Errorf("allocated %v: the cached claim keeps %d bytes of annotations, want at most %d", allocated, n, limit)
				}
			}
		})
	}
}

// A waiting claim's plan is kept for the pod webhook, up to the size of a
// plan the webhook writes; one its author padded is not.
func TestTrimClaimBoundsThePlan(t *testing.T) {
	for _, tc := range []struct {
		name, plan string
		want       map[string]string
	}{
		{"a plan as the webhook writes it", `{"profile":"train"}`, map[string]string{"prism.dev/rewrite": `{"profile":"train"}`}},
		{"a plan at the bound", strings.Repeat("x", maxCachedPlan), map[string]string{"prism.dev/rewrite": strings.Repeat("x", maxCachedPlan)}},
		{"a padded plan", strings.Repeat("x", 200<<10), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "alice", Annotations: map[string]string{"prism.dev/rewrite": tc.plan}}}
			out, err := TrimClaim(c)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, out.(*resourceapi.ResourceClaim).Annotations, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("annotations kept (-want +got):\n%s", diff)
			}
		})
	}
}
