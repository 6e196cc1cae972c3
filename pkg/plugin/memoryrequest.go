package plugin

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// checkMemoryRequest refuses a device with less memory than the claim's
// request (or subrequest, "request/subrequest") asks for in
// gpu.prism.dev/memory. The allocator checks that only where
// DRAConsumableCapacity is on in kube-scheduler; a scheduler without the gate
// ignores capacity requests, and the controller's --memory-floor=capacity
// writes a profile's memory need as one. Failing here, with the reason, beats
// a workload that runs out of memory later.
func checkMemoryRequest(claim *resourceapi.ResourceClaim, request, device string, deviceMemory uint64) error {
	want, ok := requestedMemory(claim, request)
	have := resource.NewQuantity(int64(min(deviceMemory, 1<<62)), resource.BinarySI)
	if !ok || deviceMemory == 0 || want.Cmp(*have) <= 0 {
		return nil
	}
	return fmt.Errorf("device %s has %s of memory, but request %s asks for %s of %s: the scheduler did not check the capacity request (is the DRAConsumableCapacity feature gate on in kube-scheduler?)",
		device, have, request, want.String(), memoryCapacity)
}

// requestedMemory finds the memory capacity request of a claim's request or
// subrequest by its name in an allocation result.
func requestedMemory(claim *resourceapi.ResourceClaim, name string) (resource.Quantity, bool) {
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
		q, ok := capacity.Requests[memoryCapacity]
		return q, ok
	}
	return resource.Quantity{}, false
}
