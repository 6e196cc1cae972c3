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
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Claim is what prism-controller reads of one ResourceClaim: its name, the
// WorkloadProfile it names, and the Prism devices it holds or, while it
// waits, its rewrite plan and what it waits for. The informer's transform
// (TrimClaim) turns every claim into one as it arrives, since the informer
// caches every claim of the cluster and its readers need a few names of
// each: the View counts the devices it holds or the GPUs it waits for,
// profilewrites.ProfileClaims which nodes run a claim of which profile,
// and the pod webhook (podaffinity) reads a waiting claim's plan.
//
// A Claim is never modified once made; the store and its readers share it.
type Claim struct {
	namespace, name string
	// resourceVersion tells the informer an update from a resync: it
	// passes an update whose resourceVersion did not change only to the
	// handlers due to resync.
	resourceVersion string
	profile         string      // a valid WorkloadProfile name, or ""
	held            []deviceKey // the Prism devices of its allocation
	waiting         *waitingClaim
}

// waitingClaim is what is kept of a claim without an allocation; nil where
// that is nothing.
type waitingClaim struct {
	plan string // its prism.dev/rewrite annotation, up to maxCachedPlan
	// devices is what it counts with in the load (see maxPendingDevices);
	// 0 when no pod's template made it (see View.usedByOwner).
	devices int
	pod     string // its controlling pod
	podUID  types.UID
}

// maxCachedPlan bounds the prism.dev/rewrite plan kept of a waiting claim.
const maxCachedPlan = 16 << 10

// GetObjectMeta names the Claim for the informer's store, which keys it by
// namespace and name like the claim it stands for.
func (c *Claim) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Namespace: c.namespace, Name: c.name, ResourceVersion: c.resourceVersion}
}

// NamespacedName is the claim's namespace and name, as the store keys it.
func (c *Claim) NamespacedName() types.NamespacedName {
	return types.NamespacedName{Namespace: c.namespace, Name: c.name}
}

// Profile is the WorkloadProfile the claim's prism.dev/profile annotation
// names in its namespace, or "" where it names none or is no valid name.
func (c *Claim) Profile() string { return c.profile }

// Pools returns, sorted, the pools of the Prism devices the claim holds.
func (c *Claim) Pools() []string {
	var pools []string
	for _, k := range c.held {
		pools = append(pools, k.pool)
	}
	slices.Sort(pools)
	return slices.Compact(pools)
}

// Plan is a waiting claim's prism.dev/rewrite annotation, or "" once it is
// allocated or where it is longer than any plan the claim webhook writes.
func (c *Claim) Plan() string {
	if c.waiting == nil {
		return ""
	}
	return c.waiting.plan
}

// counted says whether the claim counts as waiting in the load, given that
// its pod uses it.
func (c *Claim) counted() bool { return c.waiting != nil && c.waiting.devices > 0 }

// TrimClaim is the transform for the ResourceClaim informer of
// prism-controller: it turns a claim into a Claim. Other objects, and a
// Claim given again, pass unchanged.
func TrimClaim(obj any) (any, error) {
	if c, ok := obj.(*resourceapi.ResourceClaim); ok {
		return trimClaim(c), nil
	}
	return obj, nil
}

// ClaimOf returns the Claim that a ResourceClaim informer's object stands
// for: the Claim the transform made, or a whole claim trimmed, each also
// as a tombstone's last known state; false for anything else.
func ClaimOf(obj any) (*Claim, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	switch o := obj.(type) {
	case *Claim:
		return o, true
	case *resourceapi.ResourceClaim:
		return trimClaim(o), true
	}
	return nil, false
}

// trimClaim keeps a claim's profile only where the annotation is a valid
// name: the value is the claim's author's, up to the API's 256 KiB of
// annotations, and an invalid one names no profile to any reader. Of an
// allocated claim it keeps the Prism devices, of a waiting one what
// keepWaiting keeps.
func trimClaim(c *resourceapi.ResourceClaim) *Claim {
	out := &Claim{namespace: c.Namespace, name: c.Name, resourceVersion: c.ResourceVersion}
	out.profile, _ = prismv1alpha1.ProfileName(c.Annotations)
	a := c.Status.Allocation
	if a == nil {
		out.waiting = keepWaiting(c)
		return out
	}
	for _, r := range a.Devices.Results {
		if r.Driver == gpuv1alpha1.DriverName {
			out.held = append(out.held, deviceKey{r.Pool, r.Device})
		}
	}
	return out
}

// keepWaiting keeps of a waiting claim its rewrite plan, for the pods that
// name the claim, and, for the load, the GPUs its Prism requests ask for
// (a firstAvailable request by its first alternative), at most
// maxPendingDevices, and the pod whose template made it. Its
// prism.dev/rewrite annotation is its owner's to write, so the load takes
// the bound type from the profile instead; and the claim webhook's plans
// are under 1 KiB, so a longer one, which the claim's author wrote on a
// claim that may never be allocated, is not kept.
func keepWaiting(c *resourceapi.ResourceClaim) *waitingClaim {
	w := &waitingClaim{}
	if plan := c.Annotations[rewrite.AnnotationKey]; len(plan) <= maxCachedPlan {
		w.plan = plan
	}
	if owner := podOwner(c); owner != nil {
		if n := requestedGPUs(c); n > 0 {
			w.devices, w.pod, w.podUID = n, owner.Name, owner.UID
		}
	}
	if *w == (waitingClaim{}) {
		return nil
	}
	return w
}

// requestedGPUs sums the GPUs a claim's Prism requests ask for, each by
// its exact request or its first alternative, at most maxPendingDevices.
func requestedGPUs(c *resourceapi.ResourceClaim) int {
	devices := int64(0)
	for _, r := range c.Spec.Devices.Requests {
		class, mode, count := "", resourceapi.DeviceAllocationMode(""), int64(0)
		switch {
		case r.Exactly != nil:
			class, mode, count = r.Exactly.DeviceClassName, r.Exactly.AllocationMode, r.Exactly.Count
		case len(r.FirstAvailable) > 0:
			class, mode, count = r.FirstAvailable[0].DeviceClassName, r.FirstAvailable[0].AllocationMode, r.FirstAvailable[0].Count
		}
		if rewrite.IsGPUClass(class) && mode != resourceapi.DeviceAllocationModeAll {
			// Bounded before the sum, which counts of any size would
			// overflow.
			devices = min(devices+min(max(count, 1), maxPendingDevices), maxPendingDevices)
		}
	}
	return int(devices)
}

// podOwner returns the claim's controlling owner where that is a pod. The
// resourceclaim controller of kube-controller-manager makes a pod the
// controlling owner of each claim it makes from the pod's claim templates;
// reservedFor, the other tie to a pod, is only ever set with an
// allocation. Whoever creates a claim can write any ownerReference, so the
// pod must also name the claim in its status (View.usedByOwner). A claim
// made by hand and named by a pod's resourceClaimName has neither while it
// waits, and does not count.
func podOwner(c *resourceapi.ResourceClaim) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(c)
	if ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" {
		return nil
	}
	return ref
}
