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
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
)

// A GPU that NVML cannot read is unhealthy as far as anyone can tell: it is
// tainted gpu-lost, NoExecute, so that the pods using it are evicted, and
// it stays published so that the taint has a device to sit on. What is
// published of it depends on what is known:
//
//   - read before in this run: the device as last read;
//   - known only from the checkpoint, after a restart (a taint it had, or
//     claims prepared on it): its name, its UUID if the taint recorded it,
//     and its index, which is all that can be said without reading it
//     (rememberedDevice);
//   - nothing known: it is not published, because no pod uses it and, with
//     neither UUID nor attributes, no claim could select it. It is logged
//     and announced once, and published as soon as a rediscovery reads it.

// taintUnreadableLocked taints lost the GPU at index, which NVML cannot
// read (why), and returns what to report, if anything. claimed are the
// devices that prepared claims hold. g.mu must be held.
func (g *nodeGPUs) taintUnreadableLocked(index int, why error, claimed map[string]bool, now time.Time) (healthChange, bool) {
	name := gpu.Device{Index: index}.Name()
	prev, had := g.unhealthy[name]
	next := prev
	next.index = index
	if known, ok := g.byName[name]; ok {
		next.uuid, next.remembered = known.UUID, false
	} else if had || claimed[name] {
		next.remembered = true
	} else {
		if g.unpublished[index] {
			return healthChange{}, false
		}
		if g.unpublished == nil {
			g.unpublished = map[int]bool{}
		}
		g.unpublished[index] = true
		return healthChange{device: name, unpublished: true, reason: why.Error()}, true
	}
	delete(g.unpublished, index)
	tainted := !had || prev.taint.Value != lostValue
	if tainted {
		next.taint, next.lastEvent, next.xid = newTaint(lostValue, resourceapi.DeviceTaintEffectNoExecute, now), now, 0
	}
	g.unhealthy[name] = next
	if !tainted {
		return healthChange{}, false
	}
	return healthChange{device: name, uuid: next.uuid, tainted: true, reason: why.Error()}, true
}

// sweepUnreadableLocked forgets, before a rediscovery marks them again,
// which GPUs were unreadable and are no longer: a remembered GPU that reads
// again or is gone is not published from its record any more, and a GPU
// never read that is gone is reported again if it comes back unreadable.
// g.mu must be held.
func (g *nodeGPUs) sweepUnreadableLocked(unreadable map[int]error) {
	for name, u := range g.unhealthy {
		if _, still := unreadable[u.index]; u.remembered && !still {
			u.remembered = false
			g.unhealthy[name] = u
		}
	}
	for index := range g.unpublished {
		if _, still := unreadable[index]; !still {
			delete(g.unpublished, index)
		}
	}
}

// rememberedDevicesLocked renders the GPUs published from their record.
// g.mu must be held, at least for reading.
func (g *nodeGPUs) rememberedDevicesLocked() []resourceapi.Device {
	var out []resourceapi.Device
	for name, u := range g.unhealthy {
		if _, read := g.byName[name]; u.remembered && !read {
			out = append(out, rememberedDevice(name, u))
		}
	}
	return out
}

// rememberedDevice is a GPU published from what the checkpoint remembers of
// it: its name, its index, its UUID when known, and its taint. Nothing that
// only a reading could tell (product, memory, ...) is published, so no
// claim that selects on them matches it.
func rememberedDevice(name string, u unhealthy) resourceapi.Device {
	attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		gpuv1alpha1.IndexAttribute.Qualified(): {IntValue: ptr.To(int64(u.index))},
	}
	if u.uuid != "" {
		attrs[gpuv1alpha1.UUIDAttribute.Qualified()] = resourceapi.DeviceAttribute{StringValue: ptr.To(u.uuid)}
	}
	return resourceapi.Device{Name: name, Attributes: attrs, Taints: []resourceapi.DeviceTaint{u.taint}}
}

// withRemembered adds the remembered devices to the devices read, in index
// order.
func withRemembered(read, remembered []resourceapi.Device) []resourceapi.Device {
	if len(remembered) == 0 {
		return read
	}
	out := append(read, remembered...)
	slices.SortStableFunc(out, func(a, b resourceapi.Device) int {
		return cmp.Compare(deviceIndex(a.Name), deviceIndex(b.Name))
	})
	return out
}

// deviceIndex is the index in a device name, gpu.Device.Name's inverse.
func deviceIndex(name string) int {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "gpu-"))
	if err != nil {
		return -1
	}
	return i
}
