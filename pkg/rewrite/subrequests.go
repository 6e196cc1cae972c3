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
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// tierSelectors builds the generated selectors of each tier: the tier's own
// test first, because on a node of another class it fails on the first
// selector and the rest are never evaluated; then the hard needs.
func tierSelectors(ladder []tier, n needs) ([][]string, error) {
	out := make([][]string, len(ladder))
	for i, t := range ladder {
		for _, id := range append(slices.Clone(t.selectors), n.memory, n.cc) {
			// A partition's memory is its profile's, chosen to hold the
			// workload; the floors are cut for whole cards.
			if id < 0 || t.partition != "" && id == n.memory {
				continue
			}
			s, err := verifiedSelector(id)
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], s)
		}
	}
	return out, nil
}

// ineligible returns why req must be left alone, or "" if it can be
// rewritten.
func ineligible(req *resourceapi.DeviceRequest, generated [][]string) string {
	switch {
	case len(req.FirstAvailable) > 0:
		return "already a firstAvailable list: the user's order is kept as written"
	case req.Exactly == nil:
		return "no exactly request (unknown request type)"
	case req.Exactly.DeviceClassName != DeviceClassName:
		return "device class is not " + DeviceClassName
	case req.Exactly.AdminAccess != nil && *req.Exactly.AdminAccess:
		return "adminAccess cannot be expressed in a subrequest"
	case req.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll:
		return "allocationMode All takes every matching device; tiers would change the set, not the choice"
	}
	joinsAny := slices.ContainsFunc(generated, func(g []string) bool { return len(g) > 0 })
	if joinsAny && len(req.Exactly.Selectors) >= resourceapi.DeviceSelectorsMaxSize {
		return fmt.Sprintf("the user's selectors take all %d places; the generated one needs one", resourceapi.DeviceSelectorsMaxSize)
	}
	return ""
}

// subrequests writes one subrequest per tier. With capacityFloor, the
// memory floor becomes a capacity request on gpu.prism.dev/memory instead of
// a CEL selector: the allocator checks it without building a CEL activation.
// That is a floor only on GPUs that are not shareable; on a shareable one it
// would consume the floor instead of the whole GPU and let other claims in,
// so the caller asks for it only where no GPU is published shareable, and
// never for a memory share (the share is the capacity request already).
//
// With bounds, a tier whose test is a lower bound on a figure carries it as
// a capacity request on that figure instead, and so does the compute
// capability floor (see TierBoundsAsCapacity); a subrequest left without
// any selector is guarded by the caller's uuid constraint instead of a
// class selector.
//
// What is left of the generated tests is one selector (see joined), ahead
// of the user's.
func subrequests(exact *resourceapi.ExactDeviceRequest, ladder []tier, generated [][]string, n needs, capacityFloor, bounds bool) ([]resourceapi.DeviceSubRequest, error) {
	subs := make([]resourceapi.DeviceSubRequest, len(ladder))
	for i, t := range ladder {
		e := exact.DeepCopy()
		exprs := generated[i]
		switch {
		case t.partition != "":
			// No capacity requests: the partition is the amount, and a
			// partition publishes no figures as capacities.
		case t.share != nil:
			// The hard needs stay CEL here: the memory floor says how large
			// a GPU the workload needs, the share how much of it the claim
			// takes, and a shareable GPU publishes no smVersion capacity.
			requestCapacity(e, gpuv1alpha1.ComputeCapacity.Qualified(), *resource.NewQuantity(int64(t.share.ComputePercent), resource.DecimalSI))
			requestShare(e, t.share.Memory())
		case n.share != nil:
			requestShare(e, *n.share)
		case capacityFloor && n.floor != nil && requestShare(e, *n.floor):
			exprs = without(exprs, catalogue[n.memory])
		}
		if bounds && t.bound != nil && requestCapacity(e, t.bound.fig.capacity(), *resource.NewQuantity(t.bound.at, resource.DecimalSI)) {
			for _, id := range t.selectors {
				exprs = without(exprs, catalogue[id])
			}
		}
		if bounds && t.share == nil && t.partition == "" && n.cc >= 0 && requestCapacity(e, gpuv1alpha1.SMVersionCapacity.Qualified(), *resource.NewQuantity(n.sm, resource.DecimalSI)) {
			exprs = without(exprs, catalogue[n.cc])
		}
		var sels []resourceapi.DeviceSelector
		if len(exprs) > 0 {
			expr, err := joined(exprs)
			if err != nil {
				return nil, fmt.Errorf("tier %s: %w", t.name, err)
			}
			sels = append(sels, selector(expr))
		}
		sels = append(sels, e.Selectors...)
		subs[i] = resourceapi.DeviceSubRequest{
			Name:            t.name,
			DeviceClassName: subrequestClass(e, t, len(exprs) > 0, bounds),
			Selectors:       sels,
			AllocationMode:  e.AllocationMode,
			Count:           e.Count,
			Tolerations:     e.Tolerations,
			Capacity:        e.Capacity,
		}
	}
	return subs, nil
}

// subrequestClass picks TierDeviceClassName only where a generated selector
// comes first: every catalogue entry requires a gpu.prism.dev attribute or
// capacity, so foreign devices are out before any user selector runs (user
// CEL written for the gpu.prism.dev class may read Prism attributes without
// a guard, and on another driver's device that is an error that aborts
// scheduling of the pod). A capacity request is no such guard: an API server
// without DRAConsumableCapacity drops it and the stable allocator ignores
// it, and the subrequest would then match every driver's devices. Where the
// request is guarded by the uuid constraint (TierBoundsAsCapacity), a
// subrequest with no selector at all needs no class selector either.
//
// A partition's tier uses MIGDeviceClassName, whose own selector keeps it
// to Prism's partitions.
func subrequestClass(e *resourceapi.ExactDeviceRequest, t tier, generatedFirst, guarded bool) string {
	if t.partition != "" {
		return MIGDeviceClassName
	}
	if generatedFirst || guarded && len(e.Selectors) == 0 {
		return TierDeviceClassName
	}
	return e.DeviceClassName
}

// namesMemory says whether the user asked for an amount of memory.
func namesMemory(e *resourceapi.ExactDeviceRequest) bool {
	if e.Capacity == nil {
		return false
	}
	_, userSet := e.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]
	return userSet
}

// requestShare asks for amount of memory unless the user named an amount,
// and says whether it did.
func requestShare(e *resourceapi.ExactDeviceRequest, amount resource.Quantity) bool {
	return requestCapacity(e, gpuv1alpha1.MemoryCapacity.Qualified(), amount)
}

// requestCapacity asks for amount of capacity unless the user named an
// amount of it, and says whether it did.
func requestCapacity(e *resourceapi.ExactDeviceRequest, capacity resourceapi.QualifiedName, amount resource.Quantity) bool {
	if e.Capacity != nil {
		if _, userSet := e.Capacity.Requests[capacity]; userSet {
			return false
		}
	}
	if e.Capacity == nil {
		e.Capacity = &resourceapi.CapacityRequirements{}
	}
	if e.Capacity.Requests == nil {
		e.Capacity.Requests = map[resourceapi.QualifiedName]resource.Quantity{}
	}
	e.Capacity.Requests[capacity] = amount
	return true
}

func without(exprs []string, drop string) []string {
	out := make([]string, 0, len(exprs))
	for _, e := range exprs {
		if e != drop {
			out = append(out, e)
		}
	}
	return out
}

// selector gives each subrequest its own object, so that a caller editing
// one selector of the result cannot change another.
func selector(expr string) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}
}
