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

package plugin

import (
	"fmt"
	"math"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
)

// The Event reasons of a GPU below a hard need of the claim.
const (
	EventReasonMemoryRequestNotMet            = "MemoryRequestNotMet"
	EventReasonComputeCapabilityRequestNotMet = "ComputeCapabilityRequestNotMet"
)

// unmetHardNeed refuses a device below what the claim's request (or
// subrequest, "request/subrequest") asks for in gpu.prism.dev/memory or
// gpu.prism.dev/smVersion, and names the Event reason. The allocator checks
// those only where DRAConsumableCapacity is on in kube-scheduler; a scheduler
// without the gate may ignore capacity requests, and the controller writes a
// profile's memory and compute-capability floors as such by default. Failing
// here, with the reason, beats a workload that runs out of memory or finds
// no kernel image for the GPU later. The figures a tier prefers
// (memoryBandwidthGBps, fp32GFLOPS) are not checked: missing a preference
// costs speed, not correctness.
func unmetHardNeed(claim *resourceapi.ResourceClaim, request, device string, d gpu.Device) (reason string, err error) {
	for _, need := range []struct {
		capacity resourceapi.QualifiedName
		reason   string
		have     *resource.Quantity // nil: unknown, not checked
	}{
		{gpuv1alpha1.MemoryCapacity.Qualified(), EventReasonMemoryRequestNotMet, memoryOf(d)},
		{gpuv1alpha1.SMVersionCapacity.Qualified(), EventReasonComputeCapabilityRequestNotMet, smVersionOf(d)},
	} {
		want, ok := requestedCapacity(claim, request, need.capacity)
		if !ok || need.have == nil {
			continue
		}
		// Not want.Cmp: the request is the claim author's, and comparing or
		// printing a quantity with a huge exponent ("1E1111011110") computes
		// that power of ten, for minutes.
		asked, ferr := prismv1alpha1.BoundedValue(nil, want, math.MaxInt64)
		if ferr == nil && asked <= need.have.Value() {
			continue
		}
		var shown string
		if ferr != nil {
			shown = fmt.Sprint(ferr.BadValue)
		} else {
			shown = want.String()
		}
		return need.reason, fmt.Errorf("device %s has %s %s, but request %s asks for %s: the scheduler did not check the capacity request (is the DRAConsumableCapacity feature gate on in kube-scheduler?)",
			device, need.capacity, need.have, request, shown)
	}
	return "", nil
}

func memoryOf(d gpu.Device) *resource.Quantity {
	if d.MemoryBytes == 0 {
		return nil
	}
	return resource.NewQuantity(int64(min(d.MemoryBytes, 1<<62)), resource.BinarySI)
}

func smVersionOf(d gpu.Device) *resource.Quantity {
	sm, ok := d.CUDAComputeCapability.SMVersion()
	if !ok {
		return nil
	}
	return resource.NewQuantity(sm, resource.DecimalSI)
}

// requestedCapacity finds a capacity request of a claim's request or
// subrequest by its name in an allocation result.
func requestedCapacity(claim *resourceapi.ResourceClaim, name string, capacityName resourceapi.QualifiedName) (resource.Quantity, bool) {
	main, sub, isSub := strings.Cut(name, "/")
	for _, r := range claim.Spec.Devices.Requests {
		if r.Name != main {
			continue
		}
		var capacity *resourceapi.CapacityRequirements
		switch {
		case !isSub && r.Exactly != nil:
			capacity = r.Exactly.Capacity
		case isSub:
			for _, s := range r.FirstAvailable {
				if s.Name == sub {
					capacity = s.Capacity
				}
			}
		}
		if capacity == nil {
			return resource.Quantity{}, false
		}
		q, ok := capacity.Requests[capacityName]
		return q, ok
	}
	return resource.Quantity{}, false
}
