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

package fleet

import (
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Slice is what the View reads of one ResourceSlice: its pool, its node,
// and of each device its name, model and the uuids that tie a MIG
// partition to its GPU, with the slice's GPUs and partitions summed up by
// model. The informer's transform (TrimSlice) turns every slice into one
// as it arrives, so that neither the informer's store nor the View holds
// the slices: a device publishes about 20 attributes and a few
// capacities, of which the View reads 8 figures once.
//
// A Slice is never modified once made; the store and the View share it.
type Slice struct {
	name string
	// resourceVersion tells the informer an update from a resync: it
	// passes an update whose resourceVersion did not change only to the
	// handlers due to resync.
	resourceVersion string
	// prism is false for another driver's slice, which the View ignores.
	prism      bool
	pool       string
	node       string // the pool's node; the pool's name when the slice names none
	generation int64
	models     []rewrite.Model // the slice's GPUs, by model, sorted by name
	partitions []rewrite.PartitionModel
	devices    []sliceDevice
}

// sliceDevice is one device of a Slice.
type sliceDevice struct {
	name string
	// model is the GPU's model, shared with Slice.models; "" for a MIG
	// partition, which is not a GPU of its model.
	model string
	uuid  string // a GPU's
	// parent is a partition's GPU's uuid: a claim that holds the partition
	// keeps the whole GPU from every other claim that asks for one.
	parent string
}

// GetObjectMeta names the Slice for the informer's store, which keys it by
// name like the slice it stands for.
func (s *Slice) GetObjectMeta() metav1.Object {
	return &metav1.ObjectMeta{Name: s.name, ResourceVersion: s.resourceVersion}
}

// TrimSlice is the transform for the ResourceSlice informer that feeds the
// View: it turns a slice into a Slice. Other objects, and a Slice given
// again, pass unchanged.
func TrimSlice(obj any) (any, error) {
	if s, ok := obj.(*resourceapi.ResourceSlice); ok {
		return summarise(s), nil
	}
	return obj, nil
}

func summarise(s *resourceapi.ResourceSlice) *Slice {
	out := &Slice{name: s.Name, resourceVersion: s.ResourceVersion, prism: s.Spec.Driver == gpuv1alpha1.DriverName}
	if !out.prism {
		return out
	}
	out.pool, out.node, out.generation = s.Spec.Pool.Name, s.Spec.Pool.Name, s.Spec.Pool.Generation
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		out.node = *s.Spec.NodeName
	}
	for _, d := range s.Spec.Devices {
		name := stringAttr(d, gpuv1alpha1.ProductNameAttribute)
		if name == "" {
			continue
		}
		if profile := stringAttr(d, gpuv1alpha1.MIGProfileAttribute); profile != "" {
			// A partition is not a GPU of its model: counting it would add
			// devices and, through minKnown, a partition's figures.
			p := rewrite.PartitionModel{Model: name, Profile: profile, Devices: 1, Multiprocessors: intAttr(d, gpuv1alpha1.MultiprocessorCountAttribute)}
			if q, ok := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
				p.MemoryBytes = q.Value.Value()
			}
			i := slices.IndexFunc(out.partitions, func(q rewrite.PartitionModel) bool { return q.Model == name && q.Profile == profile })
			if i < 0 {
				out.partitions = append(out.partitions, p)
			} else {
				out.partitions[i] = mergePartition(out.partitions[i], p)
			}
			if parent := stringAttr(d, gpuv1alpha1.ParentUUIDAttribute); parent != "" {
				out.devices = append(out.devices, sliceDevice{name: d.Name, parent: parent})
			}
			continue
		}
		m := rewrite.Model{Name: name, Devices: 1, BandwidthGBps: intAttr(d, gpuv1alpha1.MemoryBandwidthGBpsAttribute), FP32GFLOPS: intAttr(d, gpuv1alpha1.FP32GFLOPSAttribute),
			Multiprocessors: intAttr(d, gpuv1alpha1.MultiprocessorCountAttribute)}
		if q, ok := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
			m.MemoryBytes = q.Value.Value()
		}
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			m.SharedDevices = 1
			if a, ok := d.Attributes[gpuv1alpha1.ComputeLimitsAttribute.Qualified()]; ok && a.BoolValue != nil && *a.BoolValue {
				m.ComputeLimitDevices = 1
			}
		}
		if publishesFiguresAsCapacity(d, m) {
			m.FigureCapacityDevices = 1
		}
		// The devices of a model share one copy of its name.
		i := slices.IndexFunc(out.models, func(o rewrite.Model) bool { return o.Name == name })
		if i < 0 {
			out.models = append(out.models, m)
			i = len(out.models) - 1
		} else {
			out.models[i] = merge(out.models[i], m)
		}
		out.devices = append(out.devices, sliceDevice{name: d.Name, model: out.models[i].Name, uuid: stringAttr(d, gpuv1alpha1.UUIDAttribute)})
	}
	slices.SortFunc(out.models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	// What the decoder allocated for more devices than were kept is
	// returned.
	out.devices = slices.Clip(out.devices)
	return out
}

// publishesFiguresAsCapacity says whether the device publishes every figure
// it has as a capacity too, which a bound written as a capacity request
// needs (rewrite.TierBoundsAsCapacity). A compute capability the plugin
// cannot write as an sm_XY number leaves smVersion out, and then the device
// does not count.
func publishesFiguresAsCapacity(d resourceapi.Device, m rewrite.Model) bool {
	_, hasCC := attribute(d, gpuv1alpha1.CUDAComputeCapabilityAttribute)
	for name, has := range map[resourceapi.QualifiedName]bool{
		gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified(): m.BandwidthGBps > 0,
		gpuv1alpha1.FP32GFLOPSCapacity.Qualified():          m.FP32GFLOPS > 0,
		gpuv1alpha1.SMVersionCapacity.Qualified():           hasCC,
	} {
		if _, ok := d.Capacity[name]; has && !ok {
			return false
		}
	}
	return true
}

// attribute looks a Prism attribute up by its qualified name, and by its
// short name, which the API treats as being in the driver's domain.
func attribute(d resourceapi.Device, id gpuv1alpha1.AttributeName) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[id.Qualified()]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(id)]
	return a, ok
}

func stringAttr(d resourceapi.Device, id gpuv1alpha1.AttributeName) string {
	if a, ok := attribute(d, id); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourceapi.Device, id gpuv1alpha1.AttributeName) int64 {
	if a, ok := attribute(d, id); ok && a.IntValue != nil {
		return *a.IntValue
	}
	return 0
}
