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

package sim

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/gpu"
)

// ModelID indexes the GPU models the evaluation fleet is built from: the
// three Gavel measured.
type ModelID int

const (
	K80 ModelID = iota
	P100
	V100
	numModels
)

// Reference is the GPU slowdowns are measured against: the fastest of the
// three for every job type, so a job alone on an idle fleet can reach 1.
const Reference = V100

func (m ModelID) String() string { return [...]string{"K80", "P100", "V100"}[m] }

// boards are the devices as NVML would describe them (Google Cloud's
// parts: K80 one GK210 die, P100 PCIe 16 GB, V100 SXM2 16 GB), with clocks
// chosen so that the published bandwidth and FP32 figures match the
// datasheets. The plugin does not know Kepler's 192 FP32 lanes per SM, so a
// K80 publishes no fp32GFLOPS, as it would in a real cluster.
var boards = [numModels]gpu.Device{
	K80: {ProductName: "Tesla K80", Brand: "Tesla", Architecture: "Kepler",
		CUDAComputeCapability: gpu.ComputeCapability{Major: 3, Minor: 7}, MemoryBytes: 12 << 30,
		MemoryBusWidthBits: 384, MaxMemoryClockMHz: 2505, MaxSMClockMHz: 875, MultiprocessorCount: 13},
	P100: {ProductName: "Tesla P100-PCIE-16GB", Brand: "Tesla", Architecture: "Pascal",
		CUDAComputeCapability: gpu.ComputeCapability{Major: 6, Minor: 0}, MemoryBytes: 16 << 30,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 715, MaxSMClockMHz: 1329, MultiprocessorCount: 56},
	V100: {ProductName: "Tesla V100-SXM2-16GB", Brand: "Tesla", Architecture: "Volta",
		CUDAComputeCapability: gpu.ComputeCapability{Major: 7, Minor: 0}, MemoryBytes: 16 << 30,
		MemoryBusWidthBits: 4096, MaxMemoryClockMHz: 877, MaxSMClockMHz: 1530, MultiprocessorCount: 80},
}

// publish returns the device the kubelet plugin would put in a
// ResourceSlice for model m.
func publish(ctx context.Context, m ModelID) (resourceapi.Device, error) {
	d := boards[m]
	d.UUID = fmt.Sprintf("GPU-sim-%s", m)
	d.DriverVersion, d.CUDADriverVersion = "535.104.05", "12.2"
	d.PCIBusID = "0000:07:00.0"
	d.NUMANode = ptr.To(0)
	d.PCIeGeneration, d.PCIeLinkWidth = 3, 16
	dev, err := d.ResourceDevice(ctx, gpu.PublishOptions{})
	if err != nil {
		return dev, fmt.Errorf("publishing a %s: %w", m, err)
	}
	return dev, nil
}

// traceModels maps the trace's GPU model codes to the evaluation fleet.
// P100 and V100 are measured; T4 has no Gavel measurement and stands in as
// the fleet's slow GDDR class, re-equipped with K80 dies (an assumption,
// see docs/simulator.md). G2, G3 (undisclosed) and A10 have nothing to map
// to and are left out.
var traceModels = map[string]ModelID{"P100": P100, "V100M16": V100, "V100M32": V100, "T4": K80}
