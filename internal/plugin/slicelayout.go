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
	"context"
	"slices"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/gpu"
)

// EventReasonMIGModeOff is the Event of a MIG-capable GPU that is published
// whole because its MIG mode is off while MIGPartitions is on.
const EventReasonMIGModeOff = "MIGModeOff"

// resourceSlices lays out the node's pool (gpu.ResourceSlices): GPUs
// published whole in one slice, as always; with MIGPartitions on, and
// unless the API server was seen to drop counters, each GPU in MIG mode as
// its whole self and its partitions in slices of their own, consuming its
// counter set, published in another slice. A partition carries its GPU's
// taint: an unhealthy GPU is unhealthy in every part; else its own, from an
// Xid of its GPU instance. An empty pool is one empty slice, so that the
// scheduler sees the node has no GPUs.
func (p *slicePool) resourceSlices(ctx context.Context) ([]resourceslice.Slice, error) {
	p.gpus.mu.RLock()
	devices := make([]gpu.Device, 0, len(p.gpus.byName))
	for _, dev := range p.gpus.byName {
		devices = append(devices, dev)
	}
	sysfs := p.gpus.sysfs
	taints := map[string]resourceapi.DeviceTaint{}
	for name, u := range p.gpus.unhealthy {
		taints[name] = u.taint
	}
	remembered := p.gpus.rememberedDevicesLocked()
	p.gpus.mu.RUnlock()
	gpu.SortByIndex(devices)

	partitioned := p.opts.MIGPartitions && !p.dropped.has(partitionableDevicesGate)
	if p.opts.MIGPartitions {
		p.noteMIGModeOff(ctx, devices)
	}
	parentOf := map[string]string{}
	for i := range devices {
		if !partitioned {
			// Published as if NVML had not answered the MIG calls: the
			// slice is exactly what it was before partitions existed.
			devices[i].MIG = nil
			continue
		}
		for _, p := range devices[i].Partitions() {
			parentOf[p.Name()] = devices[i].Name()
		}
	}

	layout, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{SysFS: sysfs, ShareMemory: p.opts.ShareMemory, FiguresAsCapacity: p.opts.FiguresAsCapacity})
	if err != nil {
		return nil, err
	}
	out := make([]resourceslice.Slice, 0, len(layout)+1)
	for _, s := range layout {
		out = append(out, resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters})
	}
	for i := range out {
		for j := range out[i].Devices {
			dev := &out[i].Devices[j]
			t, ok := taints[dev.Name]
			if parent, isPartition := parentOf[dev.Name]; isPartition {
				// The GPU's taint covers its partitions' own.
				if pt, tainted := taints[parent]; tainted {
					t, ok = pt, true
				}
			}
			if ok {
				dev.Taints = []resourceapi.DeviceTaint{t}
			}
		}
	}
	// GPUs remembered from the checkpoint join those published whole.
	plain := slices.IndexFunc(out, isPlain)
	if plain < 0 {
		out = slices.Insert(out, 0, resourceslice.Slice{Devices: []resourceapi.Device{}})
		plain = 0
	}
	out[plain].Devices = withRemembered(out[plain].Devices, remembered)
	return out, nil
}

// isPlain says whether a slice holds devices that consume no counters: the
// GPUs published whole.
func isPlain(s resourceslice.Slice) bool {
	if len(s.SharedCounters) > 0 {
		return false
	}
	return !slices.ContainsFunc(s.Devices, func(d resourceapi.Device) bool { return len(d.ConsumesCounters) > 0 })
}

// resourceDevices are the devices of resourceSlices, in slice order.
func (p *slicePool) resourceDevices(ctx context.Context) ([]resourceapi.Device, error) {
	s, err := p.resourceSlices(ctx)
	if err != nil {
		return nil, err
	}
	return sliceDevices(s), nil
}

// sliceDevices lists the devices of every slice, in order.
func sliceDevices(s []resourceslice.Slice) []resourceapi.Device {
	out := []resourceapi.Device{}
	for _, slice := range s {
		out = append(out, slice.Devices...)
	}
	return out
}

// noteMIGModeOff says, once per GPU, that a MIG-capable GPU is published
// whole because its MIG mode is off: an operator who turned MIGPartitions
// on expects partitions there. The mode is the operator's: some GPUs may
// be left whole on purpose, so the Event is Normal.
func (p *slicePool) noteMIGModeOff(ctx context.Context, devices []gpu.Device) {
	for _, dev := range devices {
		note := dev.MIGNote()
		if note == "" {
			continue
		}
		if _, seen := p.migNoted.LoadOrStore(dev.UUID, true); seen {
			continue
		}
		klog.FromContext(ctx).Info(note, "device", dev.Name(), "uuid", dev.UUID)
		p.recorder.Eventf(p.node, corev1.EventTypeNormal, EventReasonMIGModeOff, "%s", note)
	}
}
