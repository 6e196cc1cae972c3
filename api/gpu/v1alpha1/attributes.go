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

package v1alpha1

import resourceapi "k8s.io/api/resource/v1"

// DriverName is the DRA driver's name. It is the driver of the
// ResourceSlices the kubelet plugin publishes and of the allocation results
// it prepares, the domain of every attribute and capacity below, and the
// driver an opaque GpuConfig is addressed to.
const DriverName = "gpu.prism.dev"

// AttributeName is an attribute the kubelet plugin publishes on a GPU, in
// the DriverName domain and without it: a CEL selector reads it as
// device.attributes["gpu.prism.dev"].<name>. These names are the contract
// between the plugin, which publishes them (pkg/gpu), and the controller,
// which reads them (pkg/rewrite, internal/controller/fleet, internal/explain); both take them
// from here, and attributes_test.go checks that the two agree.
// docs/attributes.md describes each.
type AttributeName string

// The attributes, in the order pkg/gpu publishes them.
const (
	UUIDAttribute                  AttributeName = "uuid"
	ProductNameAttribute           AttributeName = "productName"
	IndexAttribute                 AttributeName = "index"
	MinorAttribute                 AttributeName = "minor"
	ArchitectureAttribute          AttributeName = "architecture"
	CUDAComputeCapabilityAttribute AttributeName = "cudaComputeCapability"
	DriverVersionAttribute         AttributeName = "driverVersion"
	CUDADriverVersionAttribute     AttributeName = "cudaDriverVersion"
	MemoryBandwidthGBpsAttribute   AttributeName = "memoryBandwidthGBps"
	// BandwidthClassAttribute holds one of the BandwidthClass values.
	BandwidthClassAttribute      AttributeName = "bandwidthClass"
	MultiprocessorCountAttribute AttributeName = "multiprocessorCount"
	FP32GFLOPSAttribute          AttributeName = "fp32GFLOPS"
	FP16TensorTFLOPSAttribute    AttributeName = "fp16TensorTFLOPS"
	NUMANodeAttribute            AttributeName = "numaNode"
	NVLinkDomainAttribute        AttributeName = "nvlinkDomain"
	MIGCapableAttribute          AttributeName = "migCapable"
	BrandAttribute               AttributeName = "brand"
	PCIeGenerationAttribute      AttributeName = "pcieGeneration"
	PCIeLinkWidthAttribute       AttributeName = "pcieLinkWidth"
	// ComputeLimitsAttribute is true on a shareable GPU whose kubelet
	// plugin caps a share's SMs only where its GpuConfig asks
	// (GpuSharing.ComputeLimitPercent). A plugin from before compute caps
	// holds every share to the compute the scheduler counted, so the
	// controller counts a bursty share at its peak unless every shareable
	// GPU says this.
	ComputeLimitsAttribute AttributeName = "computeLimits"
	// MIGProfileAttribute is the MIG profile of a partition, as NVIDIA
	// spells it ("1g.10gb", "1g.10gb+me"). Only partitions carry it, so
	// a selector that must match whole GPUs only tests that it is absent.
	MIGProfileAttribute AttributeName = "migProfile"
	// ParentUUIDAttribute is the uuid of the GPU a partition is cut from.
	ParentUUIDAttribute AttributeName = "parentUUID"
)

// Attributes lists every AttributeName, in the order of the constants.
func Attributes() []AttributeName {
	return []AttributeName{
		UUIDAttribute, ProductNameAttribute, IndexAttribute, MinorAttribute, ArchitectureAttribute,
		CUDAComputeCapabilityAttribute, DriverVersionAttribute, CUDADriverVersionAttribute,
		MemoryBandwidthGBpsAttribute, BandwidthClassAttribute, MultiprocessorCountAttribute,
		FP32GFLOPSAttribute, FP16TensorTFLOPSAttribute, NUMANodeAttribute, NVLinkDomainAttribute,
		MIGCapableAttribute, BrandAttribute, PCIeGenerationAttribute, PCIeLinkWidthAttribute,
		ComputeLimitsAttribute, MIGProfileAttribute, ParentUUIDAttribute,
	}
}

// Qualified is the name a device's attributes are keyed by in a
// ResourceSlice, "gpu.prism.dev/<name>".
func (n AttributeName) Qualified() resourceapi.QualifiedName {
	return resourceapi.QualifiedName(DriverName + "/" + string(n))
}

// CapacityName is a capacity the kubelet plugin publishes on a GPU, in the
// DriverName domain and without it: device.capacity["gpu.prism.dev"].<name>
// in CEL. A claim's capacity requests name it qualified.
type CapacityName string

const (
	// MemoryCapacity is the GPU's memory in bytes; on a GPU published as
	// shareable, what a claim consumes a share of.
	MemoryCapacity CapacityName = "memory"
	// ComputeCapacity is the GPU's compute in per cent of its SMs (100 for
	// the whole GPU); on a GPU published as shareable, what a claim
	// consumes a share of, enforced by MPS's active thread percentage.
	ComputeCapacity CapacityName = "compute"
	// MemoryBandwidthGBpsCapacity and FP32GFLOPSCapacity are the attributes
	// of the same name as capacities, published with the plugin's
	// --figures-as-capacity so that a claim can ask for "at least" with a
	// capacity request.
	MemoryBandwidthGBpsCapacity = CapacityName(MemoryBandwidthGBpsAttribute)
	FP32GFLOPSCapacity          = CapacityName(FP32GFLOPSAttribute)
	// SMVersionCapacity is cudaComputeCapability as nvcc's sm_XY number
	// (8.9 is 89), published beside the two above.
	SMVersionCapacity CapacityName = "smVersion"
)

// Capacities lists every CapacityName.
func Capacities() []CapacityName {
	return []CapacityName{MemoryCapacity, ComputeCapacity, MemoryBandwidthGBpsCapacity, FP32GFLOPSCapacity, SMVersionCapacity}
}

// Qualified is the name a device's capacity, and a claim's capacity
// request, are keyed by, "gpu.prism.dev/<name>".
func (n CapacityName) Qualified() resourceapi.QualifiedName {
	return resourceapi.QualifiedName(DriverName + "/" + string(n))
}

// MemorySliceCounterPrefix begins the name of each memory-slice counter in
// the counter set of a GPU in MIG mode, "memory-slice-<n>" for slice n.
// pkg/gpu publishes them and internal/explain reads them to say which slices a
// partition occupies and which claim holds them.
const MemorySliceCounterPrefix = "memory-slice-"

// The values of BandwidthClassAttribute: memoryBandwidthGBps in four
// buckets, so that a claim can ask for "fast memory" without naming one
// product's figure.
const (
	BandwidthClassLow   = "low"
	BandwidthClassMid   = "mid"
	BandwidthClassHigh  = "high"
	BandwidthClassUltra = "ultra"
)
