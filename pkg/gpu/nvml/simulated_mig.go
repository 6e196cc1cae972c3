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
	"maps"
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

// sevenSliceProfiles are the GPU-instance profiles of a GPU with seven
// compute slices (A100, H100), in the order `nvidia-smi mig -lgip` lists
// them, which is not by index (the REV profiles come second): NVML's index
// and id, the compute slices, how many instances fit, and where NVML places
// them. The boards differ only in what each profile gets (engines).
var sevenSliceProfiles = [...]struct {
	index                 int
	id, slices, instances uint32
	at                    []nvml.GpuInstancePlacement
}{
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE, 19, 1, 7, placeEach},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1, 20, 1, 1, placeEach},
	{nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV2, 15, 1, 4, placePairs},
	{nvml.GPU_INSTANCE_PROFILE_2_SLICE, 14, 2, 3, placeTwo},
	{nvml.GPU_INSTANCE_PROFILE_3_SLICE, 9, 3, 2, placeHalf},
	{nvml.GPU_INSTANCE_PROFILE_4_SLICE, 5, 4, 1, placeFirst},
	{nvml.GPU_INSTANCE_PROFILE_7_SLICE, 0, 7, 1, placeAll},
}

// engines is what a board gives one profile, the rest of a row of
// nvidia-smi mig -lgip: SMs, memory in MiB, copy engines, decoders, JPEG
// decoders and optical-flow accelerators (none of these boards has an
// encoder in MIG mode).
type engines struct {
	sms                uint32
	memMiB             uint64
	ce, dec, jpeg, ofa uint32
}

// sevenSlice gives a board's profiles: the engines of each of
// sevenSliceProfiles, in its order.
func sevenSlice(board [len(sevenSliceProfiles)]engines) []simulatedProfile {
	out := make([]simulatedProfile, len(board))
	for i, p := range sevenSliceProfiles {
		e := board[i]
		out[i] = simulatedProfile{index: p.index, placements: p.at, info: nvml.GpuInstanceProfileInfo{
			Id: p.id, SliceCount: p.slices, InstanceCount: p.instances, MultiprocessorCount: e.sms, MemorySizeMB: e.memMiB,
			CopyEngineCount: e.ce, DecoderCount: e.dec, JpegCount: e.jpeg, OfaCount: e.ofa,
		}}
	}
	return out
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
	a100x40 := sevenSlice([...]engines{
		{14, 4864, 1, 0, 0, 0},  // 1g.5gb
		{14, 4864, 1, 1, 1, 1},  // 1g.5gb+me
		{14, 9856, 1, 1, 0, 0},  // 1g.10gb
		{28, 9856, 2, 1, 0, 0},  // 2g.10gb
		{42, 19968, 3, 2, 0, 0}, // 3g.20gb
		{56, 19968, 4, 2, 0, 0}, // 4g.20gb
		{98, 40192, 7, 5, 1, 1}, // 7g.40gb
	})
	a100x80 := sevenSlice([...]engines{
		{14, 9728, 1, 0, 0, 0},  // 1g.10gb
		{14, 9728, 1, 1, 1, 1},  // 1g.10gb+me
		{14, 19968, 1, 1, 0, 0}, // 1g.20gb
		{28, 19968, 2, 1, 0, 0}, // 2g.20gb
		{42, 40192, 3, 2, 0, 0}, // 3g.40gb
		{56, 40192, 4, 2, 0, 0}, // 4g.40gb
		{98, 80640, 7, 5, 1, 1}, // 7g.80gb
	})
	// H100 SXM has a JPEG decoder per slice and eight copy engines in 7g.
	h100x80 := sevenSlice([...]engines{
		{16, 9984, 1, 1, 1, 0},   // 1g.10gb
		{16, 9984, 1, 1, 1, 1},   // 1g.10gb+me
		{26, 20096, 1, 1, 1, 0},  // 1g.20gb
		{32, 20096, 2, 2, 2, 0},  // 2g.20gb
		{60, 40448, 3, 3, 3, 0},  // 3g.40gb
		{64, 40448, 4, 4, 4, 0},  // 4g.40gb
		{132, 81152, 8, 7, 7, 1}, // 7g.80gb
	})
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
	return slices.Sorted(maps.Keys(simulatedMIGProfiles))
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
