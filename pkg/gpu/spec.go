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

import "sort"

// Spec holds what a product's public datasheet says about it, plus the
// figures NVML would report for it. Discovery falls back to a Spec when
// NVML cannot answer, and the simulated backend serves a Spec through NVML
// calls, so both paths go through the same formulas.
type Spec struct {
	// Product is the name exactly as nvmlDeviceGetName returns it.
	Product           string
	Architecture      string
	Brand             string
	ComputeCapability ComputeCapability

	// Datasheet figures (dense, no sparsity). MemoryGB is the marketing
	// size ("80GB").
	MemoryGB            int
	MemoryType          string
	BandwidthGBps       int
	FP32TFLOPS          float64
	FP16TensorTFLOPS    int
	MultiprocessorCount int

	// NVML-style figures. The clocks are picked so that MemoryBandwidthGBps
	// and FP32GFLOPS reproduce the datasheet, because a datasheet quotes
	// results and NVML reports inputs.
	MemoryBusWidthBits int
	MaxMemoryClockMHz  int
	MaxSMClockMHz      int
	PCIeGeneration     int
	PCIeLinkWidth      int
	// NVLinks is the number of NVLink links the product has; zero means
	// the product cannot join an NVLink domain.
	NVLinks    int
	MIGCapable bool
	// MemoryMiB is the framebuffer size nvmlDeviceGetMemoryInfo reports
	// on a real board, which is less than the marketing size because
	// the driver reserves some of it. It is set only for the products
	// where it was measured; zero means unmeasured.
	MemoryMiB uint64
}

// MemoryBytes is the framebuffer size the simulated backend reports, and
// discovery's fallback when NVML cannot answer: MemoryMiB where it was
// measured, else MemoryGB taken as GiB. Unmeasured products therefore
// report their marketing size, a little more than a real board does.
func (s Spec) MemoryBytes() uint64 {
	if s.MemoryMiB > 0 {
		return s.MemoryMiB << 20
	}
	return uint64(s.MemoryGB) << 30
}

var specs = []Spec{
	{
		Product: "Tesla T4", Architecture: "Turing", Brand: "Tesla",
		ComputeCapability: ComputeCapability{7, 5},
		MemoryGB:          16, MemoryType: "GDDR6", BandwidthGBps: 320,
		FP32TFLOPS: 8.1, FP16TensorTFLOPS: 65, MultiprocessorCount: 40,
		MemoryBusWidthBits: 256, MaxMemoryClockMHz: 5001, MaxSMClockMHz: 1590,
		PCIeGeneration: 3, PCIeLinkWidth: 16,
	},
	{
		// Pascal has no tensor cores, so no FP16 tensor figure is published.
		Product: "Tesla P100-PCIE-16GB", Architecture: "Pascal", Brand: "Tesla",
		ComputeCapability: ComputeCapability{6, 0},
		MemoryGB:          16, MemoryType: "HBM2", BandwidthGBps: 732,
		FP32TFLOPS: 9.3, MultiprocessorCount: 56,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 715, MaxSMClockMHz: 1303,
		PCIeGeneration: 3, PCIeLinkWidth: 16,
	},
	{
		Product: "Tesla P100-SXM2-16GB", Architecture: "Pascal", Brand: "Tesla",
		ComputeCapability: ComputeCapability{6, 0},
		MemoryGB:          16, MemoryType: "HBM2", BandwidthGBps: 732,
		FP32TFLOPS: 10.6, MultiprocessorCount: 56,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 715, MaxSMClockMHz: 1480,
		PCIeGeneration: 3, PCIeLinkWidth: 16, NVLinks: 4,
	},
	{
		// 877 MHz is what NVML reports on the boards; the formula gives
		// 898 GB/s against the datasheet's rounded 900.
		Product: "Tesla V100-PCIE-16GB", Architecture: "Volta", Brand: "Tesla",
		ComputeCapability: ComputeCapability{7, 0},
		MemoryGB:          16, MemoryType: "HBM2", BandwidthGBps: 900,
		FP32TFLOPS: 14, FP16TensorTFLOPS: 112, MultiprocessorCount: 80,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 877, MaxSMClockMHz: 1380,
		PCIeGeneration: 3, PCIeLinkWidth: 16,
	},
	{
		Product: "Tesla V100-PCIE-32GB", Architecture: "Volta", Brand: "Tesla",
		ComputeCapability: ComputeCapability{7, 0},
		MemoryGB:          32, MemoryType: "HBM2", BandwidthGBps: 900,
		FP32TFLOPS: 14, FP16TensorTFLOPS: 112, MultiprocessorCount: 80,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 877, MaxSMClockMHz: 1380,
		PCIeGeneration: 3, PCIeLinkWidth: 16,
	},
	{
		Product: "Tesla V100-SXM2-16GB", Architecture: "Volta", Brand: "Tesla",
		ComputeCapability: ComputeCapability{7, 0},
		MemoryGB:          16, MemoryType: "HBM2", BandwidthGBps: 900,
		FP32TFLOPS: 15.7, FP16TensorTFLOPS: 125, MultiprocessorCount: 80,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 877, MaxSMClockMHz: 1530,
		PCIeGeneration: 3, PCIeLinkWidth: 16, NVLinks: 6,
	},
	{
		Product: "Tesla V100-SXM2-32GB", Architecture: "Volta", Brand: "Tesla",
		ComputeCapability: ComputeCapability{7, 0},
		MemoryGB:          32, MemoryType: "HBM2", BandwidthGBps: 900,
		FP32TFLOPS: 15.7, FP16TensorTFLOPS: 125, MultiprocessorCount: 80,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 877, MaxSMClockMHz: 1530,
		PCIeGeneration: 3, PCIeLinkWidth: 16, NVLinks: 6,
	},
	{
		Product: "NVIDIA L4", Architecture: "Ada Lovelace", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 9},
		MemoryGB:          24, MemoryType: "GDDR6", BandwidthGBps: 300,
		FP32TFLOPS: 30.3, FP16TensorTFLOPS: 121, MultiprocessorCount: 58,
		MemoryBusWidthBits: 192, MaxMemoryClockMHz: 6251, MaxSMClockMHz: 2040,
		PCIeGeneration: 4, PCIeLinkWidth: 16,
	},
	{
		Product: "NVIDIA A10", Architecture: "Ampere", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 6},
		MemoryGB:          24, MemoryType: "GDDR6", BandwidthGBps: 600,
		FP32TFLOPS: 31.2, FP16TensorTFLOPS: 125, MultiprocessorCount: 72,
		MemoryBusWidthBits: 384, MaxMemoryClockMHz: 6251, MaxSMClockMHz: 1695,
		PCIeGeneration: 4, PCIeLinkWidth: 16,
	},
	{
		Product: "NVIDIA L40S", Architecture: "Ada Lovelace", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 9},
		MemoryGB:          48, MemoryType: "GDDR6", BandwidthGBps: 864,
		FP32TFLOPS: 91.6, FP16TensorTFLOPS: 362, MultiprocessorCount: 142,
		MemoryBusWidthBits: 384, MaxMemoryClockMHz: 9001, MaxSMClockMHz: 2520,
		PCIeGeneration: 4, PCIeLinkWidth: 16,
	},
	{
		Product: "NVIDIA GeForce RTX 4090", Architecture: "Ada Lovelace", Brand: "GeForce",
		ComputeCapability: ComputeCapability{8, 9},
		MemoryGB:          24, MemoryType: "GDDR6X", BandwidthGBps: 1008,
		FP32TFLOPS: 82.6, FP16TensorTFLOPS: 165, MultiprocessorCount: 128,
		MemoryBusWidthBits: 384, MaxMemoryClockMHz: 10501, MaxSMClockMHz: 2520,
		PCIeGeneration: 4, PCIeLinkWidth: 16,
	},
	{
		Product: "NVIDIA A100-PCIE-40GB", Architecture: "Ampere", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 0},
		MemoryGB:          40, MemoryType: "HBM2", BandwidthGBps: 1555,
		FP32TFLOPS: 19.5, FP16TensorTFLOPS: 312, MultiprocessorCount: 108,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 1215, MaxSMClockMHz: 1410,
		PCIeGeneration: 4, PCIeLinkWidth: 16, NVLinks: 12, MIGCapable: true,
	},
	{
		Product: "NVIDIA A100-SXM4-40GB", Architecture: "Ampere", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 0},
		MemoryGB:          40, MemoryType: "HBM2", BandwidthGBps: 1555,
		FP32TFLOPS: 19.5, FP16TensorTFLOPS: 312, MultiprocessorCount: 108,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 1215, MaxSMClockMHz: 1410,
		PCIeGeneration: 4, PCIeLinkWidth: 16, NVLinks: 12, MIGCapable: true,
	},
	{
		Product: "NVIDIA A100-SXM4-80GB", Architecture: "Ampere", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 0},
		MemoryGB:          80, MemoryType: "HBM2e", BandwidthGBps: 2039,
		FP32TFLOPS: 19.5, FP16TensorTFLOPS: 312, MultiprocessorCount: 108,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 1593, MaxSMClockMHz: 1410,
		PCIeGeneration: 4, PCIeLinkWidth: 16, NVLinks: 12, MIGCapable: true,
	},
	{
		Product: "NVIDIA A100 80GB PCIe", Architecture: "Ampere", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{8, 0},
		MemoryGB:          80, MemoryType: "HBM2e", BandwidthGBps: 1935,
		FP32TFLOPS: 19.5, FP16TensorTFLOPS: 312, MultiprocessorCount: 108,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 1512, MaxSMClockMHz: 1410,
		PCIeGeneration: 4, PCIeLinkWidth: 16, NVLinks: 12, MIGCapable: true,
	},
	{
		Product: "NVIDIA H100 PCIe", Architecture: "Hopper", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{9, 0},
		MemoryGB:          80, MemoryType: "HBM2e", BandwidthGBps: 2000,
		FP32TFLOPS: 51, FP16TensorTFLOPS: 756, MultiprocessorCount: 114,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 1563, MaxSMClockMHz: 1755,
		PCIeGeneration: 5, PCIeLinkWidth: 16, NVLinks: 12, MIGCapable: true,
	},
	{
		Product: "NVIDIA H100 80GB HBM3", Architecture: "Hopper", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{9, 0},
		MemoryGB:          80, MemoryType: "HBM3", BandwidthGBps: 3350,
		FP32TFLOPS: 67, FP16TensorTFLOPS: 989, MultiprocessorCount: 132,
		MemoryBusWidthBits: 5120, MaxMemoryClockMHz: 2619, MaxSMClockMHz: 1980,
		PCIeGeneration: 5, PCIeLinkWidth: 16, NVLinks: 18, MIGCapable: true,
		// NVML on an H100 SXM, driver 580.159.04
		// (pkg/gpu/nvml/testdata/real/nvidia-h100-80gb-hbm3.golden.json).
		MemoryMiB: 81559,
	},
	{
		Product: "NVIDIA H200", Architecture: "Hopper", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{9, 0},
		MemoryGB:          141, MemoryType: "HBM3e", BandwidthGBps: 4800,
		FP32TFLOPS: 67, FP16TensorTFLOPS: 989, MultiprocessorCount: 132,
		MemoryBusWidthBits: 6144, MaxMemoryClockMHz: 3125, MaxSMClockMHz: 1980,
		PCIeGeneration: 5, PCIeLinkWidth: 16, NVLinks: 18, MIGCapable: true,
		// nvidia-smi's memory.total on an H200.
		MemoryMiB: 143771,
	},
	{
		// The datasheet gives no SM count for B200; 148 is the enabled SM
		// count of the shipping part, and the SM clock is then fitted to the
		// datasheet's 80 TFLOPS rather than taken from a board.
		Product: "NVIDIA B200", Architecture: "Blackwell", Brand: "NVIDIA",
		ComputeCapability: ComputeCapability{10, 0},
		MemoryGB:          180, MemoryType: "HBM3e", BandwidthGBps: 8000,
		FP32TFLOPS: 80, FP16TensorTFLOPS: 2250, MultiprocessorCount: 148,
		MemoryBusWidthBits: 8192, MaxMemoryClockMHz: 3906, MaxSMClockMHz: 2112,
		PCIeGeneration: 5, PCIeLinkWidth: 16, NVLinks: 18, MIGCapable: true,
	},
}

var specsByProduct = func() map[string]Spec {
	m := make(map[string]Spec, len(specs))
	for _, s := range specs {
		m[s.Product] = s
	}
	return m
}()

// LookupSpec returns the built-in spec of a product, keyed by the name NVML
// reports for it.
func LookupSpec(product string) (Spec, bool) {
	s, ok := specsByProduct[product]
	return s, ok
}

// Products lists the products in the built-in spec table, sorted.
func Products() []string {
	names := make([]string, 0, len(specs))
	for _, s := range specs {
		names = append(names, s.Product)
	}
	sort.Strings(names)
	return names
}
