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

package nvml

import (
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// simulatedProfile is what a real board answers to
// nvmlDeviceGetGpuInstanceProfileInfo for one NVML_GPU_INSTANCE_PROFILE_*
// index, with the placements nvmlDeviceGetGpuInstancePossiblePlacements
// gives for it.
type simulatedProfile struct {
	index      int
	info       nvml.GpuInstanceProfileInfo
	placements []nvml.GpuInstancePlacement
}

// The placements NVML gives on GPUs with seven compute and eight memory
// slices (A100, H100): one-slice instances at slices 0-6, the one-slice
// profile with twice the memory and two-slice instances on even slices,
// three-slice instances on halves, and the full GPU over all eight.
var (
	placeEach  = placements(1, 0, 1, 2, 3, 4, 5, 6)
	placePairs = placements(2, 0, 2, 4, 6)
	placeTwo   = placements(2, 0, 2, 4)
	placeHalf  = placements(4, 0, 4)
	placeFirst = placements(4, 0)
	placeAll   = placements(8, 0)
)

func placements(size uint32, starts ...uint32) []nvml.GpuInstancePlacement {
	out := make([]nvml.GpuInstancePlacement, len(starts))
	for i, s := range starts {
		out[i] = nvml.GpuInstancePlacement{Start: s, Size: size}
	}
	return out
}

// profile is one row of nvidia-smi mig -lgip: NVML's id, instances, SMs,
// memory in MiB, copy engines, decoders, JPEG decoders and optical-flow
// accelerators (none of these boards has an encoder in MIG mode).
func profile(index int, id, slices, instances, sms uint32, memMiB uint64, ce, dec, jpeg, ofa uint32, at []nvml.GpuInstancePlacement) simulatedProfile {
	return simulatedProfile{index: index, placements: at, info: nvml.GpuInstanceProfileInfo{
		Id: id, SliceCount: slices, InstanceCount: instances, MultiprocessorCount: sms, MemorySizeMB: memMiB,
		CopyEngineCount: ce, DecoderCount: dec, JpegCount: jpeg, OfaCount: ofa,
	}}
}

// simulatedMIGProfiles are the GPU-instance profiles of the boards the
// simulator can put in MIG mode, by product name. Profiles, SM counts,
// engines, instance counts and placements are those of NVIDIA's MIG User
// Guide, "Supported MIG Profiles" (docs.nvidia.com/datacenter/tesla/
// mig-user-guide/supported-mig-profiles.html); memory is what nvidia-smi
// mig -lgip lists in GiB (A100-40GB 4.75 GiB for 1g.5gb, A100-80GB 9.50
// GiB for 1g.10gb, H100 80GB 9.75 GiB for 1g.10gb), in MiB. Discovery
// reads none of this: it asks NVML, and the simulator answers from here.
var simulatedMIGProfiles = func() map[string][]simulatedProfile {
	a100x40 := []simulatedProfile{
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 14, 4864, 1, 0, 0, 0, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 14, 4864, 1, 1, 1, 1, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 14, 9856, 1, 1, 0, 0, placePairs),
		profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 28, 9856, 2, 1, 0, 0, placeTwo),
		profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 42, 19968, 3, 2, 0, 0, placeHalf),
		profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 56, 19968, 4, 2, 0, 0, placeFirst),
		profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 98, 40192, 7, 5, 1, 1, placeAll),
	}
	a100x80 := []simulatedProfile{
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 14, 9728, 1, 0, 0, 0, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 14, 9728, 1, 1, 1, 1, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 14, 19968, 1, 1, 0, 0, placePairs),
		profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 28, 19968, 2, 1, 0, 0, placeTwo),
		profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 42, 40192, 3, 2, 0, 0, placeHalf),
		profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 56, 40192, 4, 2, 0, 0, placeFirst),
		profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 98, 80640, 7, 5, 1, 1, placeAll),
	}
	// H100 SXM has a JPEG decoder per slice and eight copy engines in 7g.
	h100x80 := []simulatedProfile{
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, 16, 9984, 1, 1, 1, 0, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, 16, 9984, 1, 1, 1, 1, placeEach),
		profile(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, 26, 20096, 1, 1, 1, 0, placePairs),
		profile(nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, 32, 20096, 2, 2, 2, 0, placeTwo),
		profile(nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, 60, 40448, 3, 3, 3, 0, placeHalf),
		profile(nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, 64, 40448, 4, 4, 4, 0, placeFirst),
		profile(nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, 132, 81152, 8, 7, 7, 1, placeAll),
	}
	return map[string][]simulatedProfile{
		"NVIDIA A100-SXM4-40GB": a100x40,
		"NVIDIA A100-PCIE-40GB": a100x40,
		"NVIDIA A100-SXM4-80GB": a100x80,
		"NVIDIA A100 80GB PCIe": a100x80,
		"NVIDIA H100 80GB HBM3": h100x80,
	}
}()

// SimulatedMIGProducts lists the products a fleet may put in MIG mode.
func SimulatedMIGProducts() []string {
	var out []string
	for p := range simulatedMIGProfiles {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// migFuncs answers the MIG calls of a board in MIG mode the way the real
// one does: NOT_SUPPORTED for profiles it lacks, the placements of a
// profile by its id.
func migFuncs(profiles []simulatedProfile) (func(int) (nvml.GpuInstanceProfileInfo, nvml.Return), func(*nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return)) {
	info := func(index int) (nvml.GpuInstanceProfileInfo, nvml.Return) {
		if index < 0 || index >= nvml.GPU_INSTANCE_PROFILE_COUNT {
			return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, p := range profiles {
			if p.index == index {
				return p.info, nvml.SUCCESS
			}
		}
		return nvml.GpuInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
	}
	place := func(i *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstancePlacement, nvml.Return) {
		if i == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		for _, p := range profiles {
			if p.info.Id == i.Id {
				return slices.Clone(p.placements), nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_INVALID_ARGUMENT
	}
	return info, place
}
