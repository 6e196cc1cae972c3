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

// Package fleet keeps prism-controller's live view of the GPUs Prism
// publishes: which models, how many devices of each, and the figures the
// rewrite ranks them by. It is fed by a ResourceSlice informer, so claims
// admitted after the fleet changed are cut for the new fleet.
package fleet

import (
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// View is a cache.ResourceEventHandler for a ResourceSlice informer. Fleet
// is safe to call from any goroutine and costs one atomic load: it is on
// the path of every admitted claim.
type View struct {
	mu     sync.Mutex
	slices map[types.UID]sliceSummary

	fleet atomic.Pointer[rewrite.Fleet]
}

// sliceSummary is what one slice contributes; the slice itself is not kept.
type sliceSummary struct {
	pool       string
	generation int64
	models     map[string]rewrite.Model
}

// NewView returns a View of an empty fleet.
func NewView() *View {
	v := &View{slices: map[types.UID]sliceSummary{}}
	v.publish()
	return v
}

// Fleet returns the fleet as last seen. Callers must not modify it.
func (v *View) Fleet() *rewrite.Fleet {
	return v.fleet.Load()
}

// OnAdd records a slice.
func (v *View) OnAdd(obj any, _ bool) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok || s.Spec.Driver != rewrite.DriverName {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.slices[s.UID] = summarise(s)
	v.publish()
}

// OnUpdate records a slice's new devices.
func (v *View) OnUpdate(_, obj any) { v.OnAdd(obj, false) }

// OnDelete forgets a slice.
func (v *View) OnDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, known := v.slices[s.UID]; known {
		delete(v.slices, s.UID)
		v.publish()
	}
}

// publish merges the slices into a new Fleet. Only the newest generation of
// each pool counts: the plugin replaces a pool's slices by publishing a
// higher generation, and the old ones linger until they are deleted.
func (v *View) publish() {
	newest := map[string]int64{}
	for _, s := range v.slices {
		newest[s.pool] = max(newest[s.pool], s.generation)
	}
	models := map[string]rewrite.Model{}
	for _, s := range v.slices {
		if s.generation < newest[s.pool] {
			continue
		}
		for name, m := range s.models {
			models[name] = merge(models[name], m)
		}
	}
	f := &rewrite.Fleet{Models: make([]rewrite.Model, 0, len(models))}
	for _, m := range models {
		f.Models = append(f.Models, m)
	}
	slices.SortFunc(f.Models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	v.fleet.Store(f)
}

// merge adds b's devices to a. Devices of one model publish the same
// figures unless their clocks differ (a power-capped board, another
// firmware); the model then counts with its slowest devices, so that a
// threshold cut from it admits every one of them.
func merge(a, b rewrite.Model) rewrite.Model {
	if a.Devices == 0 {
		return b
	}
	a.Devices += b.Devices
	a.BandwidthGBps = minKnown(a.BandwidthGBps, b.BandwidthGBps)
	a.FP32GFLOPS = minKnown(a.FP32GFLOPS, b.FP32GFLOPS)
	a.MemoryBytes = max(a.MemoryBytes, b.MemoryBytes)
	return a
}

// minKnown is the smaller figure, zero (not published) counting as unknown.
func minKnown(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

func summarise(s *resourceapi.ResourceSlice) sliceSummary {
	sum := sliceSummary{pool: s.Spec.Pool.Name, generation: s.Spec.Pool.Generation, models: map[string]rewrite.Model{}}
	for _, d := range s.Spec.Devices {
		name := stringAttr(d, "productName")
		if name == "" {
			continue
		}
		m := rewrite.Model{Name: name, Devices: 1, BandwidthGBps: intAttr(d, "memoryBandwidthGBps"), FP32GFLOPS: intAttr(d, "fp32GFLOPS")}
		if q, ok := d.Capacity[rewrite.MemoryCapacity]; ok {
			m.MemoryBytes = q.Value.Value()
		}
		sum.models[name] = merge(sum.models[name], m)
	}
	return sum
}

// attribute looks a Prism attribute up by its qualified name, and by its
// short name, which the API treats as being in the driver's domain.
func attribute(d resourceapi.Device, id string) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[resourceapi.QualifiedName(rewrite.DriverName+"/"+id)]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(id)]
	return a, ok
}

func stringAttr(d resourceapi.Device, id string) string {
	if a, ok := attribute(d, id); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourceapi.Device, id string) int64 {
	if a, ok := attribute(d, id); ok && a.IntValue != nil {
		return *a.IntValue
	}
	return 0
}
