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
//   - each GPU in MIG mode gets slices of its own, at most
//     ResourceSliceMaxDevicesWithAdvancedFeatures (64) devices each, since
//     its devices consume counters. An A100 with every placement of every
//     profile publishes 26 devices (its whole self and 25 placements), so
//     one slice per GPU suffices, and keeps a node's slices stable when one
//     GPU's mode changes.
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
	var perGPU [][]resourceapi.Device
	for _, d := range partitioned {
		set, ok := d.CounterSet()
		if !ok {
			return nil, fmt.Errorf("building partitions of %s: NVML listed no MIG profiles", d.Name())
		}
		if n := len(set.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
			return nil, fmt.Errorf("building partitions of %s: %d counters, more than the %d a counter set may have", d.Name(), n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
		}
		devs, err := d.PartitionDevices(ctx, opts)
		if err != nil {
			return nil, err
		}
		sets = append(sets, set)
		perGPU = append(perGPU, devs)
	}
	for _, c := range chunks(sets, resourceapi.ResourceSliceMaxCounterSets) {
		out = append(out, Slice{SharedCounters: c})
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
