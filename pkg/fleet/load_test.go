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
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/fleet/fleettest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

var a100 = fleettest.GPU{Product: "NVIDIA A100-SXM4-80GB", BandwidthGBps: 1935, FP32GFLOPS: 19500, Memory: "81920Mi", CC: "8.0.0"}

// unused is a waiting claim for count GPUs that no pod references: made by
// hand, never reserved.
func unused(ns, uid, profile string, count int64) *resourceapi.ResourceClaim {
	c := waiting(uid, "", exactly(rewrite.DeviceClassName, count))
	c.Namespace = ns
	if profile != "" {
		c.Annotations = map[string]string{"prism.dev/profile": profile}
	}
	return c
}

// ofPod makes the claim what the resourceclaim controller makes from a
// pod's claim template: the pod is its controlling owner.
func ofPod(c *resourceapi.ResourceClaim, pod string) *resourceapi.ResourceClaim {
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(pod + "-uid"), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	return c
}

// claiming writes a plan into the claim's prism.dev/rewrite annotation,
// which its owner can write too.
func claiming(c *resourceapi.ResourceClaim, plan string) *resourceapi.ResourceClaim {
	if c.Annotations == nil {
		c.Annotations = map[string]string{}
	}
	c.Annotations[rewrite.AnnotationKey] = plan
	return c
}

func profile(ns, name string, bound prismv1alpha1.BoundType) *prismv1alpha1.WorkloadProfile {
	return &prismv1alpha1.WorkloadProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "/" + name)},
		Status:     prismv1alpha1.WorkloadProfileStatus{BoundType: bound},
	}
}

// TestLoadPending: a waiting claim counts only when a pod's template made
// it, and with the bound type of its profile, whatever its annotations say.
func TestLoadPending(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events func(v *View)
		want   []rewrite.Pending
	}{
		{"a claim no pod references does not count", func(v *View) {
			v.OnAdd(unused("mallory", "c1", "", 4), true)
		}, nil},
		{"a template's claim counts", func(v *View) {
			v.OnAdd(ofPod(unused("alice", "c1", "", 4), "job-0"), true)
		}, []rewrite.Pending{{Devices: 4}}},
		{"an owner that is not a pod does not make it count", func(v *View) {
			c := unused("mallory", "c1", "", 4)
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "rs", UID: "rs-uid", Controller: ptr.To(true)}}
			v.OnAdd(c, true)
		}, nil},
		{"a pod that owns it without controlling it does not make it count", func(v *View) {
			c := ofPod(unused("mallory", "c1", "", 4), "job-0")
			c.OwnerReferences[0].Controller = nil
			v.OnAdd(c, true)
		}, nil},
		{"the bound type is the profile's, not the annotation's", func(v *View) {
			v.OnAdd(profile("mallory", "idle", prismv1alpha1.BoundTypeLatencyBound), true)
			v.OnAdd(claiming(ofPod(unused("mallory", "c1", "idle", 1), "job-0"), `{"boundType":"ComputeBound"}`), true)
		}, []rewrite.Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeLatencyBound}}},
		{"an annotation without a profile is unprofiled", func(v *View) {
			v.OnAdd(claiming(ofPod(unused("mallory", "c1", "", 1), "job-0"), `{"boundType":"ComputeBound"}`), true)
		}, []rewrite.Pending{{Devices: 1}}},
		{"a profile of the same name in another namespace is not the claim's", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			v.OnAdd(ofPod(unused("mallory", "c1", "sgemm", 1), "job-0"), true)
		}, []rewrite.Pending{{Devices: 1}}},
		{"a profile measured after the claim waits gives it its bound type", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", ""), true)
			v.OnAdd(ofPod(unused("alice", "c1", "sgemm", 2), "job-0"), true)
			_ = v.Load()
			v.OnUpdate(nil, profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound))
		}, []rewrite.Pending{{Devices: 2, BoundType: prismv1alpha1.BoundTypeComputeBound}}},
		{"a deleted profile leaves its claims unprofiled", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			v.OnAdd(ofPod(unused("alice", "c1", "sgemm", 2), "job-0"), true)
			_ = v.Load()
			v.OnDelete(cache.DeletedFinalStateUnknown{Obj: profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound)})
		}, []rewrite.Pending{{Devices: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			tc.events(v)
			got := v.Load().Pending
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("pending claims (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadAwareLadderFromView cuts a victim's load-aware ladder from the
// view: claims no pod uses, and annotations their owners write, must not
// move it off the top class; claims of pods that wait must.
func TestLoadAwareLadderFromView(t *testing.T) {
	take := []string{"bandwidth-top", "bandwidth-second", "fits"}
	yield := []string{"bandwidth-yield", "fits"}
	for _, tc := range []struct {
		name    string
		events  func(v *View)
		devices int64 // the victim's GPUs
		want    []string
	}{
		{"nobody waits: takes the top class", func(*View) {}, 1, take},
		{"three 4-GPU claims no pod uses: still takes it", func(v *View) {
			for _, uid := range []string{"c1", "c2", "c3"} {
				v.OnAdd(unused("mallory", uid, "", 4), true)
			}
		}, 1, take},
		{"three 4-GPU claims of waiting pods: yields", func(v *View) {
			for _, uid := range []string{"c1", "c2", "c3"} {
				v.OnAdd(ofPod(unused("alice", uid, "", 4), "job-"+uid), true)
			}
		}, 1, yield},
		{"a claim annotated compute-bound whose profile is latency-bound: still takes it", func(v *View) {
			v.OnAdd(profile("mallory", "idle", prismv1alpha1.BoundTypeLatencyBound), true)
			v.OnAdd(claiming(ofPod(unused("mallory", "c1", "idle", 4), "job-0"), `{"boundType":"ComputeBound"}`), true)
		}, 4, take},
		{"a claim whose profile is compute-bound: yields", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			v.OnAdd(ofPod(unused("alice", "c1", "sgemm", 4), "job-0"), true)
		}, 4, yield},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100, h100, h100), true)
			v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, a100, a100, a100, a100), true)
			v.OnAdd(fleettest.Slice("c", "gpu.prism.dev", "node-c", 1, l4, l4, l4, l4), true)
			tc.events(v)
			spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{exactly(rewrite.DeviceClassName, tc.devices)}}}
			p := rewrite.Profile{Name: "stream", BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyLoadAware}
			_, plan, err := rewrite.Rewrite(t.Context(), spec, p, rewrite.WithFleet(v.Fleet()), rewrite.WithLoad(v.Load()))
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range plan.Alternatives {
				got = append(got, a.Name)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("victim's ladder (-want +got):\n%s\nload decision: %s", diff, plan.Load)
			}
		})
	}
}
