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

// Package fleettest publishes GPUs for the tests of the packages that read
// the fleet from ResourceSlices.
package fleettest

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/sim"
)

// MixedModels is the mix of the benchmarks' fleets: equal parts of each
// product.
var MixedModels = []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA L40S", "NVIDIA L4"}

// MixedFleet lays out n nodes, n/4 of each of MixedModels, with gpus GPUs
// each, for sim.BuildCluster, which builds their slices as the kubelet
// plugin publishes them. Node group i is named <prefix>g<i>; figures
// publishes them as with the plugin's --figures-as-capacity.
func MixedFleet(prefix string, n, gpus int, figures bool) *sim.FleetConfig {
	cfg := &sim.FleetConfig{FiguresAsCapacity: figures}
	for i, model := range MixedModels {
		cfg.NodeGroups = append(cfg.NodeGroups, sim.NodeGroup{
			Name: fmt.Sprintf("%sg%d", prefix, i), Product: model, GPUsPerNode: gpus, Nodes: n / len(MixedModels),
		})
	}
	return cfg
}

// GPU is what one GPU publishes of its model.
type GPU struct {
	Product                   string
	BandwidthGBps, FP32GFLOPS int64
	Memory                    string // the memory capacity, a quantity; "": not published
	CC                        string // the CUDA compute capability; "": not published
}

// Slice is a pool's only ResourceSlice of driver, with gpus named gpu-0 on,
// the way the kubelet plugin publishes them: qualified attribute names,
// memory as a capacity.
func Slice(uid, driver, pool string, generation int64, gpus ...GPU) *resourceapi.ResourceSlice {
	s := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)},
		Spec:       resourceapi.ResourceSliceSpec{Driver: driver, Pool: resourceapi.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: 1}},
	}
	for i, g := range gpus {
		d := resourceapi.Device{
			Name: fmt.Sprintf("gpu-%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				gpuv1alpha1.ProductNameAttribute.Qualified():         {StringValue: ptr.To(g.Product)},
				gpuv1alpha1.MemoryBandwidthGBpsAttribute.Qualified(): {IntValue: ptr.To(g.BandwidthGBps)},
				gpuv1alpha1.FP32GFLOPSAttribute.Qualified():          {IntValue: ptr.To(g.FP32GFLOPS)},
			},
		}
		if g.Memory != "" {
			d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{gpuv1alpha1.MemoryCapacity.Qualified(): {Value: resource.MustParse(g.Memory)}}
		}
		if g.CC != "" {
			d.Attributes[gpuv1alpha1.CUDAComputeCapabilityAttribute.Qualified()] = resourceapi.DeviceAttribute{VersionValue: ptr.To(g.CC)}
		}
		s.Spec.Devices = append(s.Spec.Devices, d)
	}
	return s
}
