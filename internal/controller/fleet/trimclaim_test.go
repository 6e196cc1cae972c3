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
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestTrimClaimKeepsThePodOwner: the view counts a waiting claim only when
// a pod's template made it, so the informer keeps, of a waiting claim's
// owners, the pod that controls it, and nothing else.
func TestTrimClaimKeepsThePodOwner(t *testing.T) {
	pod := metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "job-0", UID: "job-0-uid", Controller: ptr.To(true)}
	notController := pod
	notController.Controller = nil
	replicaSet := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: ptr.To(true)}
	owner := metav1.OwnerReference{APIVersion: "example.com/v1", Kind: "Job", Name: "j", UID: "j-uid"}
	claim := func(owners []metav1.OwnerReference, allocated bool) *resourceapi.ResourceClaim {
		c := unused("alice", "c", "", 2)
		c.OwnerReferences = owners
		if allocated {
			c.Status.Allocation = &resourceapi.AllocationResult{}
		}
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  *waitingClaim
	}{
		{"a waiting claim of a pod keeps the pod", claim([]metav1.OwnerReference{owner, pod}, false), &waitingClaim{devices: 2, pod: "job-0", podUID: "job-0-uid"}},
		{"a waiting claim made by hand has none", claim(nil, false), nil},
		{"a pod that does not control the claim is dropped", claim([]metav1.OwnerReference{notController}, false), nil},
		{"a controller other than a pod is dropped", claim([]metav1.OwnerReference{replicaSet}, false), nil},
		{"a claim of a pod that asks for no GPU keeps no pod", func() *resourceapi.ResourceClaim {
			c := claim([]metav1.OwnerReference{pod}, false)
			c.Spec.Devices.Requests[0].Exactly.DeviceClassName = "nic.example.com"
			return c
		}(), nil},
		{"an allocated claim counts by its allocation, not its owner", claim([]metav1.OwnerReference{pod}, true), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := TrimClaim(tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, out.(*Claim).waiting, cmp.AllowUnexported(waitingClaim{})); diff != "" {
				t.Errorf("what is kept of the waiting claim (-want +got):\n%s", diff)
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
				kept := out.(*Claim)
				if got := kept.Profile(); got != tc.want {
					t.Errorf("allocated %v: kept a profile of %d bytes (%.70q), want %q", allocated, len(got), got, tc.want)
				}
				if n, limit := len(kept.Profile())+len(kept.Plan()), len(tc.want); n > limit {
					t.Errorf("allocated %v: the cached claim keeps %d bytes of annotations, want at most %d", allocated, n, limit)
				}
			}
		})
	}
}

// A waiting claim's plan is kept for the pod webhook, up to the size of a
// plan the webhook writes; one its author padded is not, and an allocated
// claim's is dropped.
func TestTrimClaimBoundsThePlan(t *testing.T) {
	for _, tc := range []struct {
		name, plan string
		allocated  bool
		want       string
	}{
		{"a plan as the webhook writes it", `{"profile":"train"}`, false, `{"profile":"train"}`},
		{"a plan at the bound", strings.Repeat("x", maxCachedPlan), false, strings.Repeat("x", maxCachedPlan)},
		{"a padded plan", strings.Repeat("x", 200<<10), false, ""},
		{"an allocated claim's plan", `{"profile":"train"}`, true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "alice", Annotations: map[string]string{rewrite.AnnotationKey: tc.plan}}}
			if tc.allocated {
				c.Status.Allocation = &resourceapi.AllocationResult{}
			}
			out, err := TrimClaim(c)
			if err != nil {
				t.Fatal(err)
			}
			if got := out.(*Claim).Plan(); got != tc.want {
				t.Errorf("plan kept: %d bytes (%.70q), want %d (%.70q)", len(got), got, len(tc.want), tc.want)
			}
		})
	}
}

// TestTrimClaimPools: a claim names the pools of its Prism devices once
// each, and no other driver's.
func TestTrimClaimPools(t *testing.T) {
	c := allocated("c", "node-b", "gpu-0", "gpu-1")
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
		resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.prism.dev", Pool: "node-a", Device: "gpu-0"},
		resourceapi.DeviceRequestAllocationResult{Request: "nic", Driver: "nic.example.com", Pool: "node-c", Device: "eth0"})
	out, err := TrimClaim(c)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"node-a", "node-b"}, out.(*Claim).Pools()); diff != "" {
		t.Errorf("pools (-want +got):\n%s", diff)
	}
}

// TestTrimClaimInAnInformer: the informer stores Claims under the claims'
// namespaces and names, and the view follows a claim from waiting to
// allocated to deleted.
func TestTrimClaimInAnInformer(t *testing.T) {
	waits := unused("alice", "c1", "", 1)
	waits.ResourceVersion = "1"
	client := fake.NewClientset(ofPod(waits, "job-0"))
	api := client.ResourceV1().ResourceClaims("")
	v := NewView()
	v.OnAdd(gpus("node-a", 2), true)
	v.OnAdd(podNaming("alice", "job-0", "c1"), true)
	informer := runInformer(t, client, cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, opts) },
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return api.Watch(ctx, opts)
		},
	}, &resourceapi.ResourceClaim{}, TrimClaim, v)
	if diff := cmp.Diff([]rewrite.Pending{{Devices: 1}}, v.Load().Pending); diff != "" {
		t.Errorf("after the list, pending (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"alice/c1"}, informer.GetStore().ListKeys()); diff != "" {
		t.Errorf("store keys, want the claim's namespace and name (-want +got):\n%s", diff)
	}
	if keys, err := informer.GetIndexer().IndexKeys(cache.NamespaceIndex, "alice"); err != nil || !cmp.Equal(keys, []string{"alice/c1"}) {
		t.Errorf("namespace index: %v (%v), want the claim", keys, err)
	}
	// The API server writes a new resourceVersion with each change, the
	// fake clientset the one it is given.
	held := allocated("c1", "node-a", "gpu-0")
	held.Namespace, held.ResourceVersion = "alice", "2"
	if _, err := client.ResourceV1().ResourceClaims("alice").UpdateStatus(t.Context(), held, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim's GPU in use", func() bool { return v.Load().Free[a100.Product] == 1 && len(v.Load().Pending) == 0 })
	if err := client.ResourceV1().ResourceClaims("alice").Delete(t.Context(), "c1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the claim's GPU free", func() bool { return v.Load().Free[a100.Product] == 2 })
}
