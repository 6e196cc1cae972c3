package rewrite

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
// A memory share (Profile.ShareMemory) and a memory request the user wrote
// keep the CEL floor: their capacity request is not the floor.
func MemoryFloorAsCapacity() Option {
	return func(o *options) { o.capacityFloor = true }
}
