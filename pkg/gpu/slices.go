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

package gpu

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// Slice is the content of one ResourceSlice of the node's pool. The API
// lets a slice hold devices or counter sets, never both, and a device may
// consume counters of a set published in another slice of the same pool.
type Slice struct {
	Devices        []resourceapi.Device
	SharedCounters []resourceapi.CounterSet
}

// ResourceSlices lays out a node's GPUs within the ResourceSlice limits
// (k8s.io/api/resource/v1):
//   - GPUs not in MIG mode go into one slice as ResourceDevices builds
//     them, split at ResourceSliceMaxDevices; with no GPU in MIG mode that
//     is exactly today's single slice;
//   - the counter sets, one per GPU in MIG mode, go into slices of at most
//     ResourceSliceMaxCounterSets (8, so one slice for an 8-GPU node);
//   - the GPUs in MIG mode, each published whole, go into one slice, at
//     most ResourceSliceMaxDevicesWithAdvancedFeatures (64) devices, since
//     they consume counters;
//   - the partitions of each GPU in MIG mode get slices of their own, at
//     most 64 devices each. An A100 with every placement of every profile
//     publishes 25, so one slice per GPU suffices, and keeps a node's
//     slices stable when one GPU's mode changes.
//
// The order is the scheduler's: its allocator takes the first device that
// fits, in slice order, and evaluates every device it passes with the
// class's CEL, and the request's, before the counters turn it away. With
// the whole GPUs ahead of every partition, a claim for a whole GPU on a
// node whose first GPUs are cut passes one device per GPU instead of each
// cut GPU's every placement (test/bench/results/2026-11-29-mig-allocator-options.md).
func ResourceSlices(ctx context.Context, devices []Device, opts PublishOptions) ([]Slice, error) {
	sorted := append([]Device(nil), devices...)
	SortByIndex(sorted)
	var whole, partitioned []Device
	for _, d := range sorted {
		if d.MIG != nil {
			partitioned = append(partitioned, d)
		} else {
			whole = append(whole, d)
		}
	}
	// ResourceDevices checks duplicate indices among whole GPUs only; a
	// duplicate across the two groups would collide on names too.
	for i := 1; i < len(sorted); i++ {
		if sorted[i-1].Index == sorted[i].Index {
			return nil, fmt.Errorf("building devices: %s and %s both have index %d", sorted[i-1].UUID, sorted[i].UUID, sorted[i].Index)
		}
	}

	var out []Slice
	if len(whole) > 0 {
		plain, err := ResourceDevices(ctx, whole, opts)
		if err != nil {
			return nil, err
		}
		for _, c := range chunks(plain, resourceapi.ResourceSliceMaxDevices) {
			out = append(out, Slice{Devices: c})
		}
	}
	var sets []resourceapi.CounterSet
	var wholeInMIGMode []resourceapi.Device
	var perGPU [][]resourceapi.Device
	for _, d := range partitioned {
		set, ok := d.CounterSet()
		if !ok {
			return nil, fmt.Errorf("building partitions of %s: NVML listed no MIG profiles", d.Name())
		}
		if n := len(set.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
			return nil, fmt.Errorf("building partitions of %s: %d counters, more than the %d a counter set may have", d.Name(), n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
		}
		self, partitions, err := d.MIGDevices(ctx, opts)
		if err != nil {
			return nil, err
		}
		sets = append(sets, set)
		wholeInMIGMode = append(wholeInMIGMode, self)
		perGPU = append(perGPU, partitions)
	}
	for _, c := range chunks(sets, resourceapi.ResourceSliceMaxCounterSets) {
		out = append(out, Slice{SharedCounters: c})
	}
	for _, c := range chunks(wholeInMIGMode, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
		out = append(out, Slice{Devices: c})
	}
	for _, devs := range perGPU {
		for _, c := range chunks(devs, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures) {
			out = append(out, Slice{Devices: c})
		}
	}
	return out, nil
}

func chunks[T any](items []T, size int) [][]T {
	var out [][]T
	for len(items) > size {
		out = append(out, items[:size:size])
		items = items[size:]
	}
	if len(items) > 0 {
		out = append(out, items)
	}
	return out
}
