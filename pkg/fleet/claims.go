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

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// claimSummary is what one claim contributes: the Prism devices it holds,
// or, while it has none and a pod's template made it, what it waits for.
type claimSummary struct {
	held    []deviceKey
	pending *pendingClaim
}

// pendingClaim is a waiting claim; its bound type and whether its pod uses
// it are looked up when the load is built, so that a profile measured
// later, or a pod status written after the claim, counts.
type pendingClaim struct {
	devices int
	profile types.NamespacedName // Name "": the claim names no profile
	claim   string               // the claim's name
	pod     types.NamespacedName // its controlling owner
	podUID  types.UID
}

// maxPendingDevices is the most GPUs one waiting claim counts with:
// AllocationResultsMaxSize, the most devices one allocation holds. The API
// accepts a claim of up to DeviceRequestsMaxSize (32) requests, each of
// any count, but the scheduler's allocator refuses a claim whose requests
// add up to more than an allocation holds, so no claim ever takes more of
// the fleet. Such a claim still counts, capped: the view does not try to
// tell whether a claim can be allocated at all (one for 32 GPUs waits
// forever on a fleet without a 32-GPU node just as well); it bounds what
// one claim weighs by what one claim can ever take.
const maxPendingDevices = resourceapi.AllocationResultsMaxSize

// Load returns free devices per model and the pending claims as last seen.
// Callers must not modify it. After a change it is rebuilt from the
// models' counts of GPUs in use and the waiting claims, not from every
// claim.
func (v *View) Load() *rewrite.Load {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.load != nil {
		return v.load
	}
	l := &rewrite.Load{Free: map[string]int{}}
	published := 0 // the GPUs of the fleet
	for _, m := range v.fleet.Load().Models {
		l.Free[m.Name] = m.Devices - v.busy[m.Name]
		published += m.Devices
	}
	for _, p := range v.waiting {
		// A claim cannot take more GPUs than the fleet has.
		if v.usedByOwner(p) && min(p.devices, published) > 0 {
			l.Pending = append(l.Pending, rewrite.Pending{Devices: min(p.devices, published), BoundType: v.boundTypes[p.profile]})
		}
	}
	v.load = l
	return l
}

// setClaim records what a claim holds or waits for, in place of what it
// held or waited for before; a zero summary forgets it. A claim that
// neither holds a Prism device nor counts as waiting is not kept.
func (v *View) setClaim(claim types.NamespacedName, c claimSummary) {
	old := v.holders[claim]
	if c.pending == nil && slices.Equal(old, c.held) {
		// A status update that keeps the allocation, such as a pod
		// reserving the claim, moves nothing. The summary is replaced all
		// the same, so that it refers to the stored object, not the one
		// the store dropped.
		if len(c.held) > 0 {
			v.holders[claim] = c.held
		}
		if v.waiting[claim] == nil {
			return
		}
	}
	for _, k := range old {
		v.release(k)
	}
	for _, k := range c.held {
		v.hold(k)
	}
	if len(c.held) > 0 {
		v.holders[claim] = c.held
	} else {
		delete(v.holders, claim)
	}
	if c.pending != nil {
		v.waiting[claim] = c.pending
	} else {
		delete(v.waiting, claim)
	}
	v.load = nil
}

// hold counts one more claim that holds the device.
func (v *View) hold(k deviceKey) {
	if v.held[k.pool] == nil {
		v.held[k.pool] = map[string]int{}
	}
	if v.held[k.pool][k.device]++; v.held[k.pool][k.device] == 1 {
		v.countInUse(k, 1)
	}
}

// release counts one claim less that holds the device.
func (v *View) release(k deviceKey) {
	if v.held[k.pool][k.device]--; v.held[k.pool][k.device] == 0 {
		deleteFrom(v.held, k.pool, k.device)
		v.countInUse(k, -1)
	}
}

// countHeld counts the devices held in the pool in (sign 1) or out (-1)
// of the GPUs in use: the pool's devices are counted out before its
// slices change, and in again after.
func (v *View) countHeld(pool string, sign int) {
	for device := range v.held[pool] {
		v.countInUse(deviceKey{pool, device}, sign)
	}
}

// countInUse counts a held device in or out of the GPUs in use. A claim
// that holds a MIG partition keeps the whole GPU from every other claim
// that asks for one; two partitions of one GPU, or a partition and the
// GPU, take it once. A device of no current pool generation takes
// nothing.
func (v *View) countInUse(k deviceKey, sign int) {
	if parent, ok := v.partitionParent[k]; ok {
		k = parent
	}
	model, ok := v.deviceModel[k]
	if !ok {
		return
	}
	v.inUse[k] += sign
	switch n := v.inUse[k]; {
	case n == 0:
		delete(v.inUse, k)
		if v.busy[model]--; v.busy[model] == 0 {
			delete(v.busy, model)
		}
	case n == 1 && sign > 0:
		v.busy[model]++
	}
	v.load = nil
}

// summariseClaim reads the devices a claim holds, or what a claim that a
// pod owns waits for: the GPUs its Prism requests ask for (a
// firstAvailable request by its first alternative), at most
// maxPendingDevices, the profile it names and the pod. Its
// prism.dev/rewrite annotation is its owner's to write, so the bound type
// is taken from the profile instead.
func summariseClaim(c *resourceapi.ResourceClaim) claimSummary {
	if a := c.Status.Allocation; a != nil {
		var held []deviceKey
		for _, r := range a.Devices.Results {
			if r.Driver == gpuv1alpha1.DriverName {
				held = append(held, deviceKey{r.Pool, r.Device})
			}
		}
		return claimSummary{held: held}
	}
	owner := podOwner(c)
	if owner == nil {
		return claimSummary{}
	}
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
	if devices == 0 {
		return claimSummary{}
	}
	p := &pendingClaim{devices: int(devices), claim: c.Name, pod: types.NamespacedName{Namespace: c.Namespace, Name: owner.Name}, podUID: owner.UID}
	if name, _ := prismv1alpha1.ProfileName(c.Annotations); name != "" {
		p.profile = types.NamespacedName{Namespace: c.Namespace, Name: name}
	}
	return claimSummary{pending: p}
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
