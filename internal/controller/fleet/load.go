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
	"k8s.io/apimachinery/pkg/types"

	"github.com/prismgpu/prism/pkg/rewrite"
)

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
	for _, c := range v.waiting {
		// A claim cannot take more GPUs than the fleet has.
		if devices := min(c.waiting.devices, published); devices > 0 && v.usedByOwner(c) {
			l.Pending = append(l.Pending, rewrite.Pending{Devices: devices, BoundType: v.boundTypes[types.NamespacedName{Namespace: c.namespace, Name: c.profile}]})
		}
	}
	v.load = l
	return l
}

// setClaim records what a claim holds or waits for, in place of what it
// held or waited for before; nil forgets it. A claim that neither holds a
// Prism device nor counts as waiting is not kept.
func (v *View) setClaim(key types.NamespacedName, c *Claim) {
	var held, old []deviceKey
	waits := false
	if c != nil {
		held, waits = c.held, c.counted()
	}
	if h := v.holders[key]; h != nil {
		old = h.held
	}
	if !waits && slices.Equal(old, held) {
		// A status update that keeps the allocation, such as a pod
		// reserving the claim, moves nothing. The claim is replaced all
		// the same, so that the view refers to the stored one, not the
		// one the store dropped.
		if len(held) > 0 {
			v.holders[key] = c
		}
		if v.waiting[key] == nil {
			return
		}
	}
	for _, k := range old {
		v.release(k)
	}
	for _, k := range held {
		v.hold(k)
	}
	if len(held) > 0 {
		v.holders[key] = c
	} else {
		delete(v.holders, key)
	}
	if waits {
		v.waiting[key] = c
	} else {
		delete(v.waiting, key)
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
