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

package mig_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"

	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

func simulatedA100(t *testing.T, records string) (mig.Interface, string) {
	t.Helper()
	fleet := &nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, MIGRecordFile: records,
		GPUs: []nvml.GPUGroup{{Product: "NVIDIA A100-SXM4-40GB", Count: 1, MIGMode: true}}}
	sim, err := nvml.NewSimulated(fleet, "node")
	if err != nil {
		t.Fatal(err)
	}
	uuid, _ := sim.Devices()[0].GetUUID()
	return mig.New(sim), uuid
}

// TestCreateListDestroy runs the NVML calls against the simulated A100,
// which answers as the driver does, and checks that a second process
// sharing the record file sees the same instances.
func TestCreateListDestroy(t *testing.T) {
	ctx := context.Background()
	records := filepath.Join(t.TempDir(), "records.jsonl")
	m, uuid := simulatedA100(t, records)
	oneSlice := mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_1_SLICE, ProfileID: 19, Start: 3, Size: 1}
	gi, err := m.CreateGPUInstance(ctx, oneSlice)
	if err != nil {
		t.Fatal(err)
	}
	ci, migUUID, err := m.CreateComputeInstance(ctx, uuid, gi)
	if err != nil {
		t.Fatal(err)
	}
	if want := nvml.SimulatedMIGUUID(uuid, uint32(gi), uint32(ci)); migUUID != want {
		t.Errorf("MIG UUID %s, want %s", migUUID, want)
	}

	other, _ := simulatedA100(t, records)
	got, err := other.GPUInstances(ctx, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]mig.GPUInstance{{Placement: oneSlice, ID: gi}}, got); diff != "" {
		t.Errorf("instances seen by another process (-want +got):\n%s", diff)
	}

	// A 2g.10gb at slices 2-3 overlaps slice 3: refused as NVML refuses it.
	_, err = m.CreateGPUInstance(ctx, mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_2_SLICE, ProfileID: 14, Start: 2, Size: 2})
	if !errors.Is(err, mig.ErrPlacementInUse) {
		t.Errorf("overlapping placement: error %v, want ErrPlacementInUse", err)
	}
	// A placement NVML does not offer for the profile.
	if _, err := m.CreateGPUInstance(ctx, mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_2_SLICE, ProfileID: 14, Start: 1, Size: 2}); err == nil {
		t.Error("a placement NVML does not offer was accepted")
	}

	if err := other.DestroyGPUInstance(ctx, uuid, gi); err != nil {
		t.Fatal(err)
	}
	if err := m.DestroyGPUInstance(ctx, uuid, gi); err != nil {
		t.Errorf("destroying a destroyed instance: %v, want nil", err)
	}
	if got, _ := m.GPUInstances(ctx, uuid); len(got) != 0 {
		t.Errorf("instances after destroy: %v", got)
	}
	recs, err := nvml.ReadMIGRecords(records)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, r := range recs {
		ops = append(ops, r.Op)
	}
	want := []string{nvml.MIGCreateGPUInstance, nvml.MIGCreateComputeInstance, nvml.MIGDestroyComputeInstance, nvml.MIGDestroyGPUInstance}
	if diff := cmp.Diff(want, ops); diff != "" {
		t.Errorf("record file (-want +got):\n%s", diff)
	}
}

// TestAFullGPURefusesMore: two 3g.20gb take all eight memory slices of an
// A100-40GB, and a 1g.5gb is refused. Without a record file the instances
// live in memory.
func TestAFullGPURefusesMore(t *testing.T) {
	ctx := context.Background()
	m, uuid := simulatedA100(t, "")
	for i, start := range []int{0, 4} {
		if _, err := m.CreateGPUInstance(ctx, mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_3_SLICE, ProfileID: 9, Start: start, Size: 4}); err != nil {
			t.Fatalf("3g.20gb #%d: %v", i, err)
		}
	}
	if _, err := m.CreateGPUInstance(ctx, mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_1_SLICE, ProfileID: 19, Start: 6, Size: 1}); !errors.Is(err, mig.ErrPlacementInUse) {
		t.Errorf("a 1g.5gb on a full GPU: %v, want ErrPlacementInUse", err)
	}
}

// TestCreateDestroysAnInstanceItCannotRead: NVML created the instance, but
// its ID cannot be read. The caller could find it again only by placement,
// where another party's may stand by then, so it is destroyed through the
// handle and the placement is free again.
func TestCreateDestroysAnInstanceItCannotRead(t *testing.T) {
	ctx := context.Background()
	fleet := &nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040,
		GPUs: []nvml.GPUGroup{{Product: "NVIDIA A100-SXM4-40GB", Count: 1, MIGMode: true}}}
	sim, err := nvml.NewSimulated(fleet, "node")
	if err != nil {
		t.Fatal(err)
	}
	dev := sim.Devices()[0]
	uuid, _ := dev.GetUUID()
	create := dev.CreateGpuInstanceWithPlacementFunc
	dev.CreateGpuInstanceWithPlacementFunc = func(info *gonvml.GpuInstanceProfileInfo, pl *gonvml.GpuInstancePlacement) (gonvml.GpuInstance, gonvml.Return) {
		gi, ret := create(info, pl)
		if ret == gonvml.SUCCESS {
			gi.(*mock.GpuInstance).GetInfoFunc = func() (gonvml.GpuInstanceInfo, gonvml.Return) {
				return gonvml.GpuInstanceInfo{}, gonvml.ERROR_UNKNOWN
			}
		}
		return gi, ret
	}
	m := mig.New(sim)
	if _, err := m.CreateGPUInstance(ctx, mig.Placement{ParentUUID: uuid, ProfileIndex: gonvml.GPU_INSTANCE_PROFILE_1_SLICE, ProfileID: 19, Start: 3, Size: 1}); err == nil {
		t.Error("creating an instance whose ID cannot be read succeeded")
	}
	if got, err := m.GPUInstances(ctx, uuid); err != nil || len(got) != 0 {
		t.Errorf("instances after the failed create: %v, %v; want none", got, err)
	}
}
