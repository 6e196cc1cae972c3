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

// Package gpu models an NVIDIA GPU as the Prism DRA driver publishes it.
// It knows nothing about how a GPU was found (see package
// github.com/prismgpu/prism/pkg/gpu/nvml) nor about Kubernetes clients; it
// only turns a Device into the resource.k8s.io/v1 Device that goes into a
// ResourceSlice.
package gpu

import (
	"fmt"
	"slices"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// Device describes one physical GPU.
type Device struct {
	UUID        string
	Index       int
	Minor       int
	ProductName string
	Brand       string
	// Architecture is the marketing name, e.g. "Hopper".
	Architecture          string
	CUDAComputeCapability ComputeCapability
	// DriverVersion is as NVML reports it, e.g. "550.54.15"; it is not
	// necessarily valid semver.
	DriverVersion string
	// CUDADriverVersion is "<major>.<minor>", e.g. "12.4".
	CUDADriverVersion   string
	MemoryBytes         uint64
	MemoryBusWidthBits  int
	MaxMemoryClockMHz   int
	MaxSMClockMHz       int
	MultiprocessorCount int
	// PCIBusID is in extended BDF notation with a 16-bit domain, lower
	// case, e.g. "0000:07:00.0", which is what sysfs and the standard
	// resource.kubernetes.io/pciBusID attribute use.
	PCIBusID string
	// NUMANode is nil when the platform does not report one.
	NUMANode       *int
	PCIeGeneration int
	PCIeLinkWidth  int
	// NVLinkDomain numbers the set of GPUs reachable from this one over
	// NVLink (directly or through NVSwitches); nil when no link is up.
	NVLinkDomain *int
	MIGCapable   bool
	// MIG is set only for a GPU whose current MIG mode is enabled, and then
	// holds what NVML says it can be cut into (see Partitions). A
	// MIG-capable GPU without it is published whole; MIGNote says why.
	MIG *MIG
}

// ComputeCapability is a CUDA compute capability such as 9.0.
type ComputeCapability struct {
	Major, Minor int
}

func (c ComputeCapability) String() string {
	return fmt.Sprintf("%d.%d", c.Major, c.Minor)
}

// SMVersion is the compute capability as nvcc's sm_XY number (8.9 is 89,
// 10.0 is 100), a number that orders as the versions do, so a capacity
// request can be a floor on it. That holds only while the minor is one
// digit, as it has been for every GPU so far; for any other it is not
// published, and the controller then keeps the compute-capability floor in
// CEL (the fleet view sees the capacity missing).
func (c ComputeCapability) SMVersion() (int64, bool) {
	if c.Major <= 0 || c.Minor < 0 || c.Minor > 9 {
		return 0, false
	}
	return int64(c.Major*10 + c.Minor), true
}

// fp32LanesPerSM is the number of FP32 results an SM retires per clock.
// Ampere consumer parts and later doubled the FP32 datapath; GA100 and
// Turing did not, so the compute capability, not the architecture name,
// decides.
func (c ComputeCapability) fp32LanesPerSM() int {
	switch c {
	case ComputeCapability{6, 0}, ComputeCapability{7, 0}, ComputeCapability{7, 2},
		ComputeCapability{7, 5}, ComputeCapability{8, 0}:
		return 64
	case ComputeCapability{6, 1}, ComputeCapability{6, 2}, ComputeCapability{8, 6},
		ComputeCapability{8, 7}, ComputeCapability{8, 9}, ComputeCapability{9, 0},
		ComputeCapability{10, 0}, ComputeCapability{10, 3}, ComputeCapability{12, 0}:
		return 128
	}
	return 0
}

// Name is the device name within the ResourceSlice. It is derived from the
// index so that claims written against "gpu-0" survive a driver restart.
func (d Device) Name() string {
	return fmt.Sprintf("gpu-%d", d.Index)
}

// MemoryBandwidthGBps is the peak memory bandwidth: two transfers per
// memory clock (NVML reports the DDR base clock) across the bus.
func (d Device) MemoryBandwidthGBps() int {
	return int(2 * int64(d.MaxMemoryClockMHz) * int64(d.MemoryBusWidthBits) / 8 / 1000)
}

// BandwidthClass buckets MemoryBandwidthGBps: low below 500 GB/s, mid below
// 1200, high up to and including 2500, ultra above.
func (d Device) BandwidthClass() string {
	switch bw := d.MemoryBandwidthGBps(); {
	case bw < 500:
		return gpuv1alpha1.BandwidthClassLow
	case bw < 1200:
		return gpuv1alpha1.BandwidthClassMid
	case bw <= 2500:
		return gpuv1alpha1.BandwidthClassHigh
	default:
		return gpuv1alpha1.BandwidthClassUltra
	}
}

// FP32GFLOPS is peak dense FP32 throughput (a fused multiply-add counts as
// two operations) at the maximum SM clock. It is 0 when the compute
// capability is one this package does not know.
func (d Device) FP32GFLOPS() int {
	lanes := d.CUDAComputeCapability.fp32LanesPerSM()
	return int(int64(d.MultiprocessorCount) * int64(lanes) * 2 * int64(d.MaxSMClockMHz) / 1000)
}

// FP16TensorTFLOPS is the datasheet's dense FP16 tensor-core throughput.
// NVML has no way to report it, so it is only known for products in the
// built-in spec table.
func (d Device) FP16TensorTFLOPS() (int, bool) {
	s, ok := LookupSpec(d.ProductName)
	if !ok || s.FP16TensorTFLOPS == 0 {
		return 0, false
	}
	return s.FP16TensorTFLOPS, true
}

// SortByIndex orders devices by NVML index, which is what makes the
// published ResourceSlice stable across restarts.
func SortByIndex(devices []Device) {
	slices.SortStableFunc(devices, func(a, b Device) int { return a.Index - b.Index })
}
