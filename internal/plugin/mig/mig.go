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

// Package mig creates and destroys MIG GPU instances and their compute
// instances through NVML, for the partitions prepare hands out. It holds no
// state: what was created, and why, is the kubelet plugin's checkpoint. It
// never changes a GPU's MIG mode.
package mig

import (
	"context"
	"errors"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

// Placement is a GPU instance as NVML creates it: a profile at a start
// memory slice of a parent GPU.
type Placement struct {
	ParentUUID string
	// ProfileIndex is the NVML_GPU_INSTANCE_PROFILE_* value the profile is
	// read with; ProfileID is NVML's id of the profile, which listed
	// instances report.
	ProfileIndex, ProfileID int
	// The instance occupies memory slices Start to Start+Size-1.
	Start, Size int
}

// Overlaps says whether two placements on one GPU share a memory slice,
// which NVML refuses.
func (p Placement) Overlaps(o Placement) bool {
	return p.ParentUUID == o.ParentUUID && p.Start < o.Start+o.Size && o.Start < p.Start+p.Size
}

// Slices spells the memory slices of the placement for people.
func (p Placement) Slices() string {
	if p.Size == 1 {
		return fmt.Sprintf("memory slice %d", p.Start)
	}
	return fmt.Sprintf("memory slices %d-%d", p.Start, p.Start+p.Size-1)
}

// GPUInstance is a GPU instance that exists on a GPU.
type GPUInstance struct {
	Placement
	ID int
}

// ErrPlacementInUse is returned, wrapped, when NVML refuses an instance
// because its memory slices or the profile's instances are taken.
var ErrPlacementInUse = errors.New("the placement is taken")

// Interface is what prepare needs of NVML for MIG. Every call opens and
// closes its own NVML session.
type Interface interface {
	// GPUInstances lists the GPU instances of every profile on the GPU.
	GPUInstances(ctx context.Context, parentUUID string) ([]GPUInstance, error)
	// CreateGPUInstance creates a GPU instance at the placement and returns
	// its ID. An instance whose ID it cannot read is destroyed again.
	CreateGPUInstance(ctx context.Context, p Placement) (int, error)
	// CreateComputeInstance creates the compute instance that spans the
	// whole GPU instance, and returns its ID and the MIG device's UUID.
	CreateComputeInstance(ctx context.Context, parentUUID string, gpuInstance int) (id int, uuid string, err error)
	// DestroyGPUInstance destroys the GPU instance's compute instances,
	// then the instance. One that does not exist is not an error, so that
	// undoing is idempotent.
	DestroyGPUInstance(ctx context.Context, parentUUID string, gpuInstance int) error
}

// New returns an Interface over an NVML library: the driver's on a real
// node, the simulated fleet's elsewhere.
func New(lib nvml.Interface) Interface {
	return &nvmlMIG{lib: lib}
}

type nvmlMIG struct {
	lib nvml.Interface
}

// session initialises NVML, finds the parent GPU and returns the function
// that shuts NVML down again.
func (m *nvmlMIG) session(ctx context.Context, parentUUID string) (nvml.Device, func(), error) {
	if ret := m.lib.Init(); ret != nvml.SUCCESS {
		return nil, nil, fmt.Errorf("initialize NVML: %v", ret)
	}
	done := func() {
		if ret := m.lib.Shutdown(); ret != nvml.SUCCESS {
			klog.FromContext(ctx).Error(ret, "Shutting down NVML after a MIG call")
		}
	}
	dev, ret := m.lib.DeviceGetHandleByUUID(parentUUID)
	if ret != nvml.SUCCESS {
		done()
		return nil, nil, fmt.Errorf("find GPU %s: %v", parentUUID, ret)
	}
	return dev, done, nil
}

func (m *nvmlMIG) GPUInstances(ctx context.Context, parentUUID string) ([]GPUInstance, error) {
	dev, done, err := m.session(ctx, parentUUID)
	if err != nil {
		return nil, err
	}
	defer done()
	var out []GPUInstance
	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			// Profiles the GPU lacks answer NOT_SUPPORTED or INVALID_ARGUMENT.
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("list GPU instances of profile %d on GPU %s: %v", info.Id, parentUUID, ret)
		}
		for _, gi := range gis {
			gii, ret := gi.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, fmt.Errorf("read a GPU instance of profile %d on GPU %s: %v", info.Id, parentUUID, ret)
			}
			out = append(out, GPUInstance{ID: int(gii.Id), Placement: Placement{
				ParentUUID: parentUUID, ProfileIndex: index, ProfileID: int(gii.ProfileId),
				Start: int(gii.Placement.Start), Size: int(gii.Placement.Size),
			}})
		}
	}
	return out, nil
}

func (m *nvmlMIG) CreateGPUInstance(ctx context.Context, p Placement) (int, error) {
	dev, done, err := m.session(ctx, p.ParentUUID)
	if err != nil {
		return 0, err
	}
	defer done()
	info, ret := dev.GetGpuInstanceProfileInfo(p.ProfileIndex)
	if ret != nvml.SUCCESS {
		return 0, fmt.Errorf("read GPU-instance profile %d of GPU %s: %v", p.ProfileIndex, p.ParentUUID, ret)
	}
	if int(info.Id) != p.ProfileID {
		return 0, fmt.Errorf("GPU-instance profile %d of GPU %s has id %d, not %d as when it was published", p.ProfileIndex, p.ParentUUID, info.Id, p.ProfileID)
	}
	gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(p.Start), Size: uint32(p.Size)})
	switch ret {
	case nvml.SUCCESS:
	case nvml.ERROR_INSUFFICIENT_RESOURCES:
		return 0, fmt.Errorf("create GPU instance of profile %d at %s of GPU %s: NVML says %v: %w", p.ProfileID, p.Slices(), p.ParentUUID, ret, ErrPlacementInUse)
	default:
		return 0, fmt.Errorf("create GPU instance of profile %d at %s of GPU %s: %v", p.ProfileID, p.Slices(), p.ParentUUID, ret)
	}
	gii, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		// Without its ID the caller could find the instance again only by
		// its placement, where by then another party's may stand: destroy
		// it through the handle, which is surely the one just created.
		err := fmt.Errorf("read the GPU instance created at %s of GPU %s: %v", p.Slices(), p.ParentUUID, ret)
		if ret := gi.Destroy(); ret != nvml.SUCCESS {
			return 0, fmt.Errorf("%w; destroying it again: %v", err, ret)
		}
		return 0, err
	}
	return int(gii.Id), nil
}

func (m *nvmlMIG) gpuInstance(dev nvml.Device, parentUUID string, id int) (nvml.GpuInstance, bool, error) {
	gi, ret := dev.GetGpuInstanceById(id)
	switch ret {
	case nvml.SUCCESS:
		return gi, true, nil
	case nvml.ERROR_NOT_FOUND, nvml.ERROR_INVALID_ARGUMENT:
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("find GPU instance %d of GPU %s: %v", id, parentUUID, ret)
}

func (m *nvmlMIG) CreateComputeInstance(ctx context.Context, parentUUID string, id int) (int, string, error) {
	dev, done, err := m.session(ctx, parentUUID)
	if err != nil {
		return 0, "", err
	}
	defer done()
	gi, ok, err := m.gpuInstance(dev, parentUUID, id)
	if err != nil {
		return 0, "", err
	}
	if !ok {
		return 0, "", fmt.Errorf("GPU instance %d of GPU %s is gone", id, parentUUID)
	}
	// The compute-instance profile with the most slices the GPU instance
	// offers is the one that spans it.
	var full *nvml.ComputeInstanceProfileInfo
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && (full == nil || info.SliceCount > full.SliceCount) {
			full = &info
		}
	}
	if full == nil {
		return 0, "", fmt.Errorf("GPU instance %d of GPU %s offers no compute-instance profile", id, parentUUID)
	}
	ci, ret := gi.CreateComputeInstance(full)
	if ret != nvml.SUCCESS {
		return 0, "", fmt.Errorf("create compute instance of profile %d in GPU instance %d of GPU %s: %v", full.Id, id, parentUUID, ret)
	}
	cii, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return 0, "", fmt.Errorf("read the compute instance created in GPU instance %d of GPU %s: %v", id, parentUUID, ret)
	}
	uuid, err := migUUID(dev, parentUUID, id, int(cii.Id))
	if err != nil {
		return 0, "", err
	}
	return int(cii.Id), uuid, nil
}

// migUUID finds the MIG device of a compute instance among the parent's.
func migUUID(dev nvml.Device, parentUUID string, gi, ci int) (string, error) {
	n, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return "", fmt.Errorf("count MIG devices of GPU %s: %v", parentUUID, ret)
	}
	for i := range n {
		mig, ret := dev.GetMigDeviceHandleByIndex(i)
		if ret != nvml.SUCCESS {
			continue
		}
		g, gret := mig.GetGpuInstanceId()
		c, cret := mig.GetComputeInstanceId()
		if gret != nvml.SUCCESS || cret != nvml.SUCCESS || g != gi || c != ci {
			continue
		}
		uuid, ret := mig.GetUUID()
		if ret != nvml.SUCCESS {
			return "", fmt.Errorf("read UUID of the MIG device of GPU instance %d, compute instance %d on GPU %s: %v", gi, ci, parentUUID, ret)
		}
		return uuid, nil
	}
	return "", fmt.Errorf("GPU %s lists no MIG device for GPU instance %d, compute instance %d", parentUUID, gi, ci)
}

func (m *nvmlMIG) DestroyGPUInstance(ctx context.Context, parentUUID string, id int) error {
	dev, done, err := m.session(ctx, parentUUID)
	if err != nil {
		return err
	}
	defer done()
	gi, ok, err := m.gpuInstance(dev, parentUUID, id)
	if err != nil || !ok {
		return err
	}
	for index := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(index, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			continue
		}
		cis, ret := gi.GetComputeInstances(&info)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("list compute instances of GPU instance %d of GPU %s: %v", id, parentUUID, ret)
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS && ret != nvml.ERROR_INVALID_ARGUMENT {
				return fmt.Errorf("destroy a compute instance of GPU instance %d of GPU %s: %v (is a process still using it?)", id, parentUUID, ret)
			}
		}
	}
	switch ret := gi.Destroy(); ret {
	case nvml.SUCCESS, nvml.ERROR_INVALID_ARGUMENT, nvml.ERROR_NOT_FOUND:
		return nil
	default:
		return fmt.Errorf("destroy GPU instance %d of GPU %s: %v", id, parentUUID, ret)
	}
}
