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
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// The operations a MIG record file lists.
const (
	MIGCreateGPUInstance      = "create-gpu-instance"
	MIGCreateComputeInstance  = "create-compute-instance"
	MIGDestroyComputeInstance = "destroy-compute-instance"
	MIGDestroyGPUInstance     = "destroy-gpu-instance"
)

// MIGRecord is one line of a simulated node's MIG record file: a GPU or
// compute instance created or destroyed on a simulated GPU in MIG mode.
// The file is what the simulated GPUs hold, replayed on every call, so that
// instances outlive the plugin process as they outlive it on a real GPU, and
// so that a test in another process can see what was created and destroyed,
// or create an instance as an administrator would.
type MIGRecord struct {
	Op string `json:"op"`
	// UUID is the parent GPU's.
	UUID        string `json:"uuid"`
	GPUInstance uint32 `json:"gpuInstance"`
	// ProfileID, Start and Size are set on MIGCreateGPUInstance.
	ProfileID uint32 `json:"profileID,omitempty"`
	Start     uint32 `json:"start,omitempty"`
	Size      uint32 `json:"size,omitempty"`
	// ComputeInstance is set on the compute-instance operations, and
	// ComputeProfile, the NVML_COMPUTE_INSTANCE_PROFILE_* index, on
	// MIGCreateComputeInstance.
	ComputeInstance uint32 `json:"computeInstance,omitempty"`
	ComputeProfile  uint32 `json:"computeProfile,omitempty"`
}

// ReadMIGRecords reads a MIG record file; a missing file has no records.
func ReadMIGRecords(path string) ([]MIGRecord, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading MIG record file: %w", err)
	}
	var out []MIGRecord
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var r MIGRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("MIG record file %s, line %d: %w", path, line, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// AppendMIGRecord appends one record to the file, as the simulated GPUs do;
// tests use it to stand in for an administrator's nvidia-smi mig -cgi.
func AppendMIGRecord(path string, r MIGRecord) error {
	line, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return fmt.Errorf("appending to MIG record file: %w", err)
	}
	// One write of a whole line with O_APPEND: a process killed after it
	// returns has left the line in the file.
	_, werr := f.Write(append(line, '\n'))
	return errors.Join(werr, f.Close())
}

// simulatedInstances are the GPU and compute instances of a simulated
// node's GPUs in MIG mode. With a record file they are the file's replay,
// read again on every call; without one they live in memory.
type simulatedInstances struct {
	file string

	mu       sync.Mutex
	profiles map[string][]simulatedProfile // by parent UUID
	gis      map[string]map[uint32]*simulatedGI
	// loadErr is why the record file could not be read; every call then
	// fails with ERROR_UNKNOWN rather than act on a wrong picture.
	loadErr error
}

type simulatedGI struct {
	profile     simulatedProfile
	start, size uint32
	cis         map[uint32]nvml.ComputeInstanceProfileInfo
}

func newSimulatedInstances(file string) *simulatedInstances {
	return &simulatedInstances{file: file, profiles: map[string][]simulatedProfile{}, gis: map[string]map[uint32]*simulatedGI{}}
}

// computeSlices are the compute slices of each
// NVML_COMPUTE_INSTANCE_PROFILE_* index that a simulated GPU instance offers.
var computeSlices = map[int]uint32{
	nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE: 1,
	nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE: 2,
	nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE: 3,
	nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE: 4,
	nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE: 7,
}

// sync brings the state in line with the record file. Callers hold mu.
func (s *simulatedInstances) sync() {
	if s.file == "" {
		return
	}
	records, err := ReadMIGRecords(s.file)
	s.loadErr = err
	if err != nil {
		return
	}
	s.gis = map[string]map[uint32]*simulatedGI{}
	for _, r := range records {
		s.apply(r)
	}
}

// apply changes the state by one record; records naming what does not
// exist are ignored, as replaying a file that another process appends to
// must not fail on a line it cannot explain.
func (s *simulatedInstances) apply(r MIGRecord) {
	gis := s.gis[r.UUID]
	switch r.Op {
	case MIGCreateGPUInstance:
		i := slices.IndexFunc(s.profiles[r.UUID], func(p simulatedProfile) bool { return p.info.Id == r.ProfileID })
		if i < 0 {
			return
		}
		if gis == nil {
			gis = map[uint32]*simulatedGI{}
			s.gis[r.UUID] = gis
		}
		gis[r.GPUInstance] = &simulatedGI{profile: s.profiles[r.UUID][i], start: r.Start, size: r.Size, cis: map[uint32]nvml.ComputeInstanceProfileInfo{}}
	case MIGCreateComputeInstance:
		if gi := gis[r.GPUInstance]; gi != nil {
			gi.cis[r.ComputeInstance] = gi.computeProfile(int(r.ComputeProfile))
		}
	case MIGDestroyComputeInstance:
		if gi := gis[r.GPUInstance]; gi != nil {
			delete(gi.cis, r.ComputeInstance)
		}
	case MIGDestroyGPUInstance:
		delete(gis, r.GPUInstance)
	}
}

// record applies a change and appends it to the file. Callers hold mu.
func (s *simulatedInstances) record(r MIGRecord) nvml.Return {
	if s.file != "" {
		if err := AppendMIGRecord(s.file, r); err != nil {
			return nvml.ERROR_UNKNOWN
		}
	}
	s.apply(r)
	return nvml.SUCCESS
}

// computeProfile is what the GPU instance answers for a
// compute-instance profile index: its share of the instance's SMs.
func (gi *simulatedGI) computeProfile(index int) nvml.ComputeInstanceProfileInfo {
	slices := computeSlices[index]
	return nvml.ComputeInstanceProfileInfo{
		Id: uint32(index), SliceCount: slices, InstanceCount: gi.profile.info.SliceCount / max(slices, 1),
		MultiprocessorCount:   gi.profile.info.MultiprocessorCount * slices / max(gi.profile.info.SliceCount, 1),
		SharedCopyEngineCount: gi.profile.info.CopyEngineCount, SharedDecoderCount: gi.profile.info.DecoderCount,
		SharedJpegCount: gi.profile.info.JpegCount, SharedOfaCount: gi.profile.info.OfaCount,
	}
}

// wire answers the instance calls of one simulated GPU in MIG mode the way
// NVML does: a GPU instance only at a placement NVML offers for its profile,
// never over another instance's memory slices (ERROR_INSUFFICIENT_RESOURCES,
// as the driver answers), no more of a profile than its instance count, and
// a GPU instance destroyed only once its compute instances are
// (ERROR_IN_USE).
func (s *simulatedInstances) wire(dev *mock.Device, uuid string, profiles []simulatedProfile) {
	s.mu.Lock()
	s.profiles[uuid] = profiles
	s.mu.Unlock()
	dev.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sync()
		if s.loadErr != nil {
			return nil, nvml.ERROR_UNKNOWN
		}
		if info == nil || pl == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		i := slices.IndexFunc(profiles, func(p simulatedProfile) bool { return p.info.Id == info.Id })
		if i < 0 || !slices.Contains(profiles[i].placements, *pl) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		same := 0
		for _, gi := range s.gis[uuid] {
			if gi.start < pl.Start+pl.Size && pl.Start < gi.start+gi.size {
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
			if gi.profile.info.Id == info.Id {
				same++
			}
		}
		if same >= int(profiles[i].info.InstanceCount) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		id := uint32(1)
		for s.gis[uuid][id] != nil {
			id++
		}
		if ret := s.record(MIGRecord{Op: MIGCreateGPUInstance, UUID: uuid, GPUInstance: id, ProfileID: info.Id, Start: pl.Start, Size: pl.Size}); ret != nvml.SUCCESS {
			return nil, ret
		}
		return s.gpuInstance(dev, uuid, id), nvml.SUCCESS
	}
	dev.GetGpuInstancesFunc = func(info *nvml.GpuInstanceProfileInfo) ([]nvml.GpuInstance, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sync()
		if s.loadErr != nil {
			return nil, nvml.ERROR_UNKNOWN
		}
		if info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.GpuInstance
		for _, id := range slices.Sorted(maps.Keys(s.gis[uuid])) {
			if s.gis[uuid][id].profile.info.Id == info.Id {
				out = append(out, s.gpuInstance(dev, uuid, id))
			}
		}
		return out, nvml.SUCCESS
	}
	dev.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sync()
		if id < 0 || s.gis[uuid][uint32(id)] == nil {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return s.gpuInstance(dev, uuid, uint32(id)), nvml.SUCCESS
	}
	// MIG device handles, one per compute instance, in the order of their
	// GPU and compute instance IDs: what nvcdi and the plugin look up a MIG
	// device's UUID by.
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(index int) (nvml.Device, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.sync()
		n := 0
		for _, gid := range slices.Sorted(maps.Keys(s.gis[uuid])) {
			for _, cid := range slices.Sorted(maps.Keys(s.gis[uuid][gid].cis)) {
				if n == index {
					return migDevice(dev, uuid, gid, cid), nvml.SUCCESS
				}
				n++
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// gpuInstance is a handle of an existing GPU instance; its calls fail with
// ERROR_INVALID_ARGUMENT once the instance is gone, as a stale handle's do.
func (s *simulatedInstances) gpuInstance(dev *mock.Device, uuid string, id uint32) *mock.GpuInstance {
	// lookup is called with mu held.
	lookup := func() *simulatedGI {
		s.sync()
		if s.loadErr != nil {
			return nil
		}
		return s.gis[uuid][id]
	}
	gi := &mock.GpuInstance{}
	gi.GetInfoFunc = func() (nvml.GpuInstanceInfo, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := lookup()
		if g == nil {
			return nvml.GpuInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
		}
		return nvml.GpuInstanceInfo{Device: dev, Id: id, ProfileId: g.profile.info.Id, Placement: nvml.GpuInstancePlacement{Start: g.start, Size: g.size}}, nvml.SUCCESS
	}
	gi.GetComputeInstanceProfileInfoFunc = func(profile, engine int) (nvml.ComputeInstanceProfileInfo, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := lookup()
		switch {
		case g == nil:
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_INVALID_ARGUMENT
		case engine != nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		n, ok := computeSlices[profile]
		if !ok || n > g.profile.info.SliceCount {
			return nvml.ComputeInstanceProfileInfo{}, nvml.ERROR_NOT_SUPPORTED
		}
		return g.computeProfile(profile), nvml.SUCCESS
	}
	gi.CreateComputeInstanceFunc = func(info *nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := lookup()
		if g == nil || info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		used := uint32(0)
		for _, ci := range g.cis {
			used += ci.SliceCount
		}
		if used+info.SliceCount > g.profile.info.SliceCount {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		cid := uint32(0)
		for _, taken := g.cis[cid]; taken; _, taken = g.cis[cid] {
			cid++
		}
		if _, ok := computeSlices[int(info.Id)]; !ok || info.SliceCount != computeSlices[int(info.Id)] {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		if ret := s.record(MIGRecord{Op: MIGCreateComputeInstance, UUID: uuid, GPUInstance: id, ComputeInstance: cid, ComputeProfile: info.Id}); ret != nvml.SUCCESS {
			return nil, ret
		}
		return s.computeInstance(dev, gi, uuid, id, cid), nvml.SUCCESS
	}
	gi.GetComputeInstancesFunc = func(info *nvml.ComputeInstanceProfileInfo) ([]nvml.ComputeInstance, nvml.Return) {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := lookup()
		if g == nil || info == nil {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		var out []nvml.ComputeInstance
		for _, cid := range slices.Sorted(maps.Keys(g.cis)) {
			if g.cis[cid].Id == info.Id {
				out = append(out, s.computeInstance(dev, gi, uuid, id, cid))
			}
		}
		return out, nvml.SUCCESS
	}
	gi.DestroyFunc = func() nvml.Return {
		s.mu.Lock()
		defer s.mu.Unlock()
		g := lookup()
		switch {
		case g == nil:
			return nvml.ERROR_INVALID_ARGUMENT
		case len(g.cis) > 0:
			return nvml.ERROR_IN_USE
		}
		return s.record(MIGRecord{Op: MIGDestroyGPUInstance, UUID: uuid, GPUInstance: id})
	}
	return gi
}

func (s *simulatedInstances) computeInstance(dev *mock.Device, gi *mock.GpuInstance, uuid string, gid, cid uint32) *mock.ComputeInstance {
	return &mock.ComputeInstance{
		GetInfoFunc: func() (nvml.ComputeInstanceInfo, nvml.Return) {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.sync()
			g := s.gis[uuid][gid]
			if g == nil {
				return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			p, ok := g.cis[cid]
			if !ok {
				return nvml.ComputeInstanceInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return nvml.ComputeInstanceInfo{Device: dev, GpuInstance: gi, Id: cid, ProfileId: p.Id}, nvml.SUCCESS
		},
		DestroyFunc: func() nvml.Return {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.sync()
			g := s.gis[uuid][gid]
			if g == nil {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			if _, ok := g.cis[cid]; !ok {
				return nvml.ERROR_INVALID_ARGUMENT
			}
			return s.record(MIGRecord{Op: MIGDestroyComputeInstance, UUID: uuid, GPUInstance: gid, ComputeInstance: cid})
		},
	}
}

// migDevice is the handle of the MIG device of one compute instance.
func migDevice(parent *mock.Device, uuid string, gid, cid uint32) *mock.Device {
	return &mock.Device{
		IsMigDeviceHandleFunc:                  func() (bool, nvml.Return) { return true, nvml.SUCCESS },
		GetUUIDFunc:                            func() (string, nvml.Return) { return SimulatedMIGUUID(uuid, gid, cid), nvml.SUCCESS },
		GetGpuInstanceIdFunc:                   func() (int, nvml.Return) { return int(gid), nvml.SUCCESS },
		GetComputeInstanceIdFunc:               func() (int, nvml.Return) { return int(cid), nvml.SUCCESS },
		GetDeviceHandleFromMigDeviceHandleFunc: func() (nvml.Device, nvml.Return) { return parent, nvml.SUCCESS },
	}
}

// SimulatedMIGUUID is the UUID of the simulated MIG device of a GPU
// instance and compute instance, derived from them as the simulated GPUs'
// UUIDs are from the node, so that it is the same in every process.
func SimulatedMIGUUID(parent string, gpuInstance, computeInstance uint32) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d", parent, gpuInstance, computeInstance))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("MIG-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}
