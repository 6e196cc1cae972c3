package rewrite

import "fmt"

// MemoryFloorAsCapacity writes the memory floor as a capacity request on
// gpu.prism.dev/memory instead of a CEL selector: the allocator checks it
// without building a CEL activation, and a tier left with no selector needs
// no class selector either (see TierDeviceClassName). Use it only where
//   - DRAConsumableCapacity is on in the API server and the scheduler: with
//     the gate off the API server drops the request, floor included, and a
//     scheduler without it refuses the claim;
//   - no GPU is published shareable (the plugin's memory sharing is off): on
//     a shareable GPU the request would take the floor instead of the whole
//     GPU and let other claims share it.
//
// The caller vouches for the first condition. The second is checked where a
// fleet is given (WithFleet): a fleet with a shareable GPU keeps the CEL
// floor, and the plan says why.
//
// A memory share (Profile.ShareMemory) and a memory request the user wrote
// keep the CEL floor: their capacity request is not the floor.
func MemoryFloorAsCapacity() Option {
	return func(o *options) { o.capacityFloor = true }
}

// Memory floor forms, as Plan.MemoryFloor names them.
const (
	MemoryFloorCapacity = "capacity"
	MemoryFloorCEL      = "cel"
)

// memoryFloorForm decides between the capacity request and the CEL floor
// where the caller asked for the capacity request, and says why when it is
// declined.
func (o *options) memoryFloorForm() (capacity bool, why string) {
	if !o.capacityFloor {
		return false, ""
	}
	if o.fleet != nil {
		shared := 0
		for _, m := range o.fleet.Models {
			shared += m.SharedDevices
		}
		if shared > 0 {
			return false, fmt.Sprintf("%s: %d GPUs are published shareable, where a capacity request is a share, not a floor", MemoryFloorCEL, shared)
		}
	}
	return true, MemoryFloorCapacity
}
