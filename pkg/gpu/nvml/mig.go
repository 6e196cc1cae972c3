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
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/gpu"
)

// readMIG reads what a GPU in MIG mode can be cut into. It returns nil,
// with the reason logged, for a GPU whose current mode is not enabled
// (including one whose enable is pending a reset): such a GPU is published
// whole, and gpu.Device.MIGNote tells the operator. Discovery only reads
// the mode; it never sets it.
func readMIG(logger klog.Logger, h nvml.Device, memoryBytes uint64) *gpu.MIG {
	current, pending, ret := h.GetMigMode()
	if ret != nvml.SUCCESS {
		return nil
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		if pending == nvml.DEVICE_MIG_ENABLE {
			logger.Info("MIG mode is pending enable and takes effect after a GPU reset; publishing the GPU whole until then")
		}
		return nil
	}

	// Every profile the enum knows is asked for: a GPU answers
	// NOT_SUPPORTED or INVALID_ARGUMENT for the ones it lacks, so a new
	// GPU's profiles come from its driver, not from a table here.
	var profiles []gpu.MIGProfile
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(index)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_INVALID_ARGUMENT:
			continue
		default:
			logger.Info("Cannot read MIG profile; leaving it out", "profileIndex", index, "err", ret)
			continue
		}
		placements, ret := h.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			logger.Info("Cannot read placements of MIG profile; leaving it out", "profileIndex", index, "profileID", info.Id, "err", ret)
			continue
		}
		p := gpu.MIGProfile{
			Index:               index,
			ID:                  int(info.Id),
			Name:                profileName(index, info, memoryBytes),
			SliceCount:          int(info.SliceCount),
			InstanceCount:       int(info.InstanceCount),
			MultiprocessorCount: int(info.MultiprocessorCount),
			MemoryMiB:           info.MemorySizeMB,
			CopyEngines:         int(info.CopyEngineCount),
			Decoders:            int(info.DecoderCount),
			Encoders:            int(info.EncoderCount),
			JPEGDecoders:        int(info.JpegCount),
			OFAs:                int(info.OfaCount),
		}
		for _, pl := range placements {
			p.Placements = append(p.Placements, gpu.MIGPlacement{Start: int(pl.Start), Size: int(pl.Size)})
		}
		if len(p.Placements) == 0 {
			continue
		}
		profiles = append(profiles, p)
	}
	if len(profiles) == 0 {
		logger.Info("GPU is in MIG mode but NVML lists no GPU-instance profile; publishing it whole")
		return nil
	}
	// Smallest first, as nvidia-smi lists them, so that the published
	// devices read in order of size whatever order the enum has.
	slices.SortStableFunc(profiles, func(a, b gpu.MIGProfile) int {
		return cmp.Or(cmp.Compare(a.SliceCount, b.SliceCount), cmp.Compare(a.MemoryMiB, b.MemoryMiB), cmp.Compare(a.Index, b.Index))
	})
	logger.V(2).Info("Read MIG profiles", "profiles", len(profiles))
	return &gpu.MIG{Profiles: profiles}
}

// profileName spells a profile as NVIDIA does, "<slices>g.<memory>gb" and
// a suffix for the variants. nvmlDeviceGetGpuInstanceProfileInfo (the only
// variant go-nvml's mock can serve) has no name, so it is derived the way
// the names are made: the memory as a fraction of the GPU's, rounded up to
// an eighth, times the GPU's memory in whole GB. That turns the 4864 MiB of
// an A100-40GB's smallest profile into "5gb" and the 9984 MiB of an
// H100's into "10gb".
func profileName(index int, info nvml.GpuInstanceProfileInfo, memoryBytes uint64) string {
	gb := uint64(0)
	if memoryBytes > 0 {
		fraction := math.Ceil(float64(info.MemorySizeMB<<20)/float64(memoryBytes)*8) / 8
		gb = uint64(math.Round(fraction * math.Ceil(float64(memoryBytes)/float64(1<<30))))
	}
	return fmt.Sprintf("%dg.%dgb%s", info.SliceCount, gb, profileSuffixes[index])
}

// profileSuffixes are the variants' suffixes by NVML_GPU_INSTANCE_PROFILE_*;
// REV2 is the one-slice profile with twice the memory and has none.
var profileSuffixes = map[int]string{
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_REV1:   "+me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_4_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_3_SLICE_GFX:    "+gfx",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_NO_ME:  "-me",
	nvml.GPU_INSTANCE_PROFILE_1_SLICE_ALL_ME: "+me.all",
	nvml.GPU_INSTANCE_PROFILE_2_SLICE_ALL_ME: "+me.all",
}
