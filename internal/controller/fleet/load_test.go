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
	"math"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
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

// ofPod makes the pod the claim's controlling owner, as the resourceclaim
// controller does for a claim it makes from the pod's claim template, and
// as anyone who creates a claim can.
func ofPod(c *resourceapi.ResourceClaim, pod string) *resourceapi.ResourceClaim {
	c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod, UID: types.UID(pod + "-uid"), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	return c
}

// podNaming is an unscheduled pod whose status names the claims that the
// resourceclaim controller made from its claim templates.
func podNaming(ns, pod string, claims ...string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: pod, UID: types.UID(pod + "-uid")}}
	for i, c := range claims {
		p.Status.ResourceClaimStatuses = append(p.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: "gpu-" + string(rune('a'+i)), ResourceClaimName: ptr.To(c)})
	}
	return p
}

// fromTemplate adds the claim as the resourceclaim controller makes it
// from a pod's claim template: the pod is its controlling owner, and the
// pod's status names it.
func fromTemplate(v *View, c *resourceapi.ResourceClaim, pod string) {
	v.OnAdd(podNaming(c.Namespace, pod, c.Name), true)
	v.OnAdd(ofPod(c, pod), true)
}

// gpus is a node's slice of n A100s.
func gpus(node string, n int) *resourceapi.ResourceSlice {
	return fleettest.Slice(node, "gpu.prism.dev", node, 1, slices.Repeat([]fleettest.GPU{a100}, n)...)
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
// it (the pod owns it and its status names it), and with the bound type of
// its profile, whatever its annotations say.
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
			fromTemplate(v, unused("alice", "c1", "", 4), "job-0")
		}, []rewrite.Pending{{Devices: 4}}},
		{"a template's claim counts once its pod's status names it", func(v *View) {
			v.OnAdd(podNaming("alice", "job-0"), true)
			v.OnAdd(ofPod(unused("alice", "c1", "", 4), "job-0"), true)
			_ = v.Load()
			v.OnUpdate(nil, podNaming("alice", "job-0", "c1"))
		}, []rewrite.Pending{{Devices: 4}}},
		{"an ownerReference to a pod whose status names another claim does not count", func(v *View) {
			fromTemplate(v, unused("mallory", "genuine", "", 1), "job-0")
			v.OnAdd(ofPod(unused("mallory", "forged", "", 4), "job-0"), true)
		}, []rewrite.Pending{{Devices: 1}}},
		{"an ownerReference to a pod whose status names no claim does not count", func(v *View) {
			v.OnAdd(podNaming("mallory", "sleeper"), true)
			v.OnAdd(ofPod(unused("mallory", "forged", "", 4), "sleeper"), true)
		}, nil},
		{"an ownerReference to a pod that does not exist does not count", func(v *View) {
			v.OnAdd(ofPod(unused("mallory", "forged", "", 4), "job-0"), true)
		}, nil},
		{"an ownerReference with another pod's UID does not count", func(v *View) {
			p := podNaming("mallory", "job-0", "c1")
			p.UID = "job-0-recreated"
			v.OnAdd(p, true)
			v.OnAdd(ofPod(unused("mallory", "c1", "", 4), "job-0"), true)
		}, nil},
		{"a pod of another namespace that names a claim of that name does not make it count", func(v *View) {
			v.OnAdd(podNaming("alice", "job-0", "c1"), true)
			v.OnAdd(ofPod(unused("mallory", "c1", "", 4), "job-0"), true)
		}, nil},
		{"a claim of a pod that left (scheduled, ended or deleted) does not count", func(v *View) {
			fromTemplate(v, unused("alice", "c1", "", 4), "job-0")
			_ = v.Load()
			v.OnDelete(cache.DeletedFinalStateUnknown{Obj: podNaming("alice", "job-0", "c1")})
		}, nil},
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
			fromTemplate(v, claiming(unused("mallory", "c1", "idle", 1), `{"boundType":"ComputeBound"}`), "job-0")
		}, []rewrite.Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeLatencyBound}}},
		{"an annotation without a profile is unprofiled", func(v *View) {
			fromTemplate(v, claiming(unused("mallory", "c1", "", 1), `{"boundType":"ComputeBound"}`), "job-0")
		}, []rewrite.Pending{{Devices: 1}}},
		{"an annotation that is no WorkloadProfile name names none", func(v *View) {
			// No API server holds such a profile; a cache fed from a CRD
			// without name validation could.
			v.OnAdd(profile("mallory", "Idle", prismv1alpha1.BoundTypeLatencyBound), true)
			fromTemplate(v, unused("mallory", "c1", "Idle", 1), "job-0")
		}, []rewrite.Pending{{Devices: 1}}},
		{"a profile of the same name in another namespace is not the claim's", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			fromTemplate(v, unused("mallory", "c1", "sgemm", 1), "job-0")
		}, []rewrite.Pending{{Devices: 1}}},
		{"a profile measured after the claim waits gives it its bound type", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", ""), true)
			fromTemplate(v, unused("alice", "c1", "sgemm", 2), "job-0")
			_ = v.Load()
			v.OnUpdate(nil, profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound))
		}, []rewrite.Pending{{Devices: 2, BoundType: prismv1alpha1.BoundTypeComputeBound}}},
		{"a deleted profile leaves its claims unprofiled", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			fromTemplate(v, unused("alice", "c1", "sgemm", 2), "job-0")
			_ = v.Load()
			v.OnDelete(cache.DeletedFinalStateUnknown{Obj: profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound)})
		}, []rewrite.Pending{{Devices: 2}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			v.OnAdd(gpus("node-a", 8), true)
			tc.events(v)
			got := v.Load().Pending
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("pending claims (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadPendingIsBounded: a waiting claim counts with at most the
// devices one allocation holds, and never more than the fleet publishes,
// however many its requests ask for.
func TestLoadPendingIsBounded(t *testing.T) {
	const most = resourceapi.AllocationResultsMaxSize
	requests := func(n int, count int64) []resourceapi.DeviceRequest {
		out := make([]resourceapi.DeviceRequest, n)
		for i := range out {
			out[i] = exactly(rewrite.DeviceClassName, count)
			out[i].Name = string(rune('a' + i))
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		published int // GPUs of the fleet
		requests  []resourceapi.DeviceRequest
		want      []rewrite.Pending
	}{
		{"a claim within the bound counts what it asks for", 40, requests(2, 8), []rewrite.Pending{{Devices: 16}}},
		{"a claim for as many as one allocation holds counts them", 40, requests(1, most), []rewrite.Pending{{Devices: most}}},
		{"one request for more than one allocation holds is capped", 40, requests(1, most+1), []rewrite.Pending{{Devices: most}}},
		{"32 requests of 32 devices count as one allocation", 40, requests(resourceapi.DeviceRequestsMaxSize, most), []rewrite.Pending{{Devices: most}}},
		{"counts too large to add up are capped", 40, requests(2, math.MaxInt64), []rewrite.Pending{{Devices: most}}},
		{"a claim for more than the fleet publishes counts the fleet", 8, requests(2, 8), []rewrite.Pending{{Devices: 8}}},
		{"nothing published: nothing counts", 0, requests(1, 1), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			if tc.published > 0 {
				v.OnAdd(gpus("node-a", tc.published), true)
			}
			c := waiting("c1", "", tc.requests...)
			c.Namespace = "mallory"
			fromTemplate(v, c, "job-0")
			if diff := cmp.Diff(tc.want, v.Load().Pending, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("pending claims (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadAwareLadderFromView cuts a victim's load-aware ladder from the
// view: claims no pod uses (whatever pod their ownerReference names), and
// annotations their owners write, must not move it off the top class;
// claims of pods that wait must.
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
				fromTemplate(v, unused("alice", uid, "", 4), "job-"+uid)
			}
		}, 1, yield},
		{"three 4-GPU claims owned by a waiting pod that does not use them: still takes it", func(v *View) {
			v.OnAdd(podNaming("mallory", "sleeper"), true)
			for _, uid := range []string{"c1", "c2", "c3"} {
				v.OnAdd(ofPod(unused("mallory", uid, "", 4), "sleeper"), true)
			}
		}, 1, take},
		{"a claim annotated compute-bound whose profile is latency-bound: still takes it", func(v *View) {
			v.OnAdd(profile("mallory", "idle", prismv1alpha1.BoundTypeLatencyBound), true)
			fromTemplate(v, claiming(unused("mallory", "c1", "idle", 4), `{"boundType":"ComputeBound"}`), "job-0")
		}, 4, take},
		{"a claim whose profile is compute-bound: yields", func(v *View) {
			v.OnAdd(profile("alice", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
			fromTemplate(v, unused("alice", "c1", "sgemm", 4), "job-0")
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
