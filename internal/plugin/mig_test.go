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

package plugin

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// migNode is a simulated node with one A100-40GB in MIG mode whose
// instances live in a record file, so that they outlive a driver as they
// outlive the plugin on a real GPU.
type migNode struct {
	dir, fleet, records string
}

func newMIGNode(t *testing.T) migNode {
	t.Helper()
	dir := t.TempDir()
	n := migNode{dir: dir, fleet: filepath.Join(dir, "fleet.yaml"), records: filepath.Join(dir, "mig-records.jsonl")}
	fleet := fmt.Sprintf(`driverVersion: "550.54.15"
cudaDriverVersion: 12040
migRecordFile: %s
gpus:
- product: NVIDIA A100-SXM4-40GB
  count: 1
  migMode: true
`, n.records)
	if err := os.WriteFile(n.fleet, []byte(fleet), 0o644); err != nil {
		t.Fatal(err)
	}
	return n
}

// simulated is a fresh NVML of the node, as another process would open.
func (n migNode) simulated(t *testing.T) *nvml.Simulated {
	t.Helper()
	fleet, err := nvml.LoadFleet(n.fleet)
	if err != nil {
		t.Fatal(err)
	}
	sim, err := nvml.NewSimulated(fleet, testNode)
	if err != nil {
		t.Fatal(err)
	}
	return sim
}

// driver starts a driver on the node's state, as a plugin (re)start does.
func (n migNode) driver(t *testing.T) *Driver {
	t.Helper()
	return newTestDriverWith(t, "t4-2.yaml", n.dir, func(c *Config) {
		c.Inventory = nvml.NewFleetInventory(n.fleet, testNode)
		if err := cdi.MakeFakeMIGCaps(filepath.Join(n.dir, "driver-root"), []int{0}); err != nil {
			t.Fatal(err)
		}
		c.MIG = mig.New(n.simulated(t))
	})
}

// instances are the GPU instances on the GPU, as "profile@start".
func (n migNode) instances(t *testing.T) []string {
	t.Helper()
	sim := n.simulated(t)
	uuid, _ := sim.Devices()[0].GetUUID()
	gis, err := mig.New(sim).GPUInstances(context.Background(), uuid)
	if err != nil {
		t.Fatal(err)
	}
	out := []string{}
	for _, gi := range gis {
		out = append(out, fmt.Sprintf("%d@%d", gi.ProfileID, gi.Start))
	}
	return out
}

// ops are the record file's operations, "op profile@start" for GPU
// instances.
func (n migNode) ops(t *testing.T) []string {
	t.Helper()
	records, err := nvml.ReadMIGRecords(n.records)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range records {
		s := r.Op
		if r.Op == nvml.MIGCreateGPUInstance {
			s += fmt.Sprintf(" %d@%d", r.ProfileID, r.Start)
		}
		out = append(out, s)
	}
	return out
}

// createByHand creates a GPU instance as an administrator's nvidia-smi
// would, outside Prism.
func (n migNode) createByHand(t *testing.T, profileIndex int, start uint32) {
	t.Helper()
	dev := n.simulated(t).Devices()[0]
	info, ret := dev.GetGpuInstanceProfileInfo(profileIndex)
	if ret != gonvml.SUCCESS {
		t.Fatal(ret)
	}
	if _, ret := dev.CreateGpuInstanceWithPlacement(&info, &gonvml.GpuInstancePlacement{Start: start, Size: info.SliceCount}); ret != gonvml.SUCCESS {
		t.Fatalf("creating GPU instance by hand: %v", ret)
	}
}

// A 1g.5gb of an A100-40GB is NVML profile 19; at memory slice 3 it is
// this partition.
const partition1g = "gpu-0-mig-1g5gb-3"

var (
	wantCreated   = []string{"create-gpu-instance 19@3", "create-compute-instance"}
	wantDestroyed = []string{"destroy-compute-instance", "destroy-gpu-instance"}
)

func TestMIGPrepareCreatesAndUnprepareDestroys(t *testing.T) {
	n := newMIGNode(t)
	d := n.driver(t)
	if r := prepare(t, d, allocatedClaim("m", []string{partition1g}))["m"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if diff := cmp.Diff(wantCreated, n.ops(t)); diff != "" {
		t.Errorf("NVML calls of prepare (-want +got):\n%s", diff)
	}
	rec, _ := d.state.checkpoint.Get("m")
	m := rec.Devices[0].MIG
	if m == nil || !m.Created || !strings.HasPrefix(m.UUID, "MIG-") {
		t.Fatalf("checkpoint does not hold the created instances: %+v", m)
	}
	spec, err := os.ReadFile(filepath.Join(n.dir, "cdi", cdi.SpecFileName("m")))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{m.UUID, "/dev/nvidia0", "/dev/nvidia-caps/nvidia-cap"} {
		if !strings.Contains(string(spec), want) {
			t.Errorf("CDI spec lacks %s:\n%s", want, spec)
		}
	}

	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "m"}})
	if err != nil || res["m"] != nil {
		t.Fatal(err, res["m"])
	}
	if diff := cmp.Diff(append(wantCreated, wantDestroyed...), n.ops(t)); diff != "" {
		t.Errorf("NVML calls of prepare and unprepare (-want +got):\n%s", diff)
	}
	if got := n.instances(t); len(got) != 0 {
		t.Errorf("instances left after unprepare: %v", got)
	}
}

type crashed string

// TestMIGCrashLeavesNoOrphan stops a prepare at each MIG crash point, as
// a SIGKILL would, and restarts the driver: the instance it created is
// destroyed and the claim forgotten, so the kubelet's retry starts afresh.
func TestMIGCrashLeavesNoOrphan(t *testing.T) {
	for _, point := range MIGCrashPoints {
		t.Run(point, func(t *testing.T) {
			n := newMIGNode(t)
			d := n.driver(t)
			d.state.partitions.crashHook = func(p string) {
				if p == point {
					panic(crashed(p))
				}
			}
			func() {
				defer func() {
					if r := recover(); r != crashed(point) {
						t.Fatalf("prepare did not reach crash point %s: %v", point, r)
					}
				}()
				prepare(t, d, allocatedClaim("m", []string{partition1g}))
			}()
			if got := n.instances(t); len(got) != 1 {
				t.Fatalf("instances at the crash: %v, want the one prepare created", got)
			}

			restarted := n.driver(t)
			if got := n.instances(t); len(got) != 0 {
				t.Errorf("orphaned instances after restart: %v", got)
			}
			if _, ok := restarted.state.checkpoint.Get("m"); ok {
				t.Error("interrupted prepare was not rolled back")
			}
			// The retry finds the placement free.
			if r := prepare(t, restarted, allocatedClaim("m", []string{partition1g}))["m"]; r.Err != nil {
				t.Fatalf("retried prepare: %v", r.Err)
			}
		})
	}
}

func TestMIGInstanceNotCreatedByPrismSurvivesRestart(t *testing.T) {
	n := newMIGNode(t)
	// An administrator's 2g.10gb at slices 4-5, then a prepare of Prism's
	// at slice 3 that crashes before recording the instance.
	n.createByHand(t, gonvml.GPU_INSTANCE_PROFILE_2_SLICE, 4)
	d := n.driver(t)
	d.state.partitions.crashHook = func(p string) {
		if p == CrashAfterMIGGPUInstanceCreated {
			panic(crashed(p))
		}
	}
	func() {
		defer func() { _ = recover() }()
		prepare(t, d, allocatedClaim("m", []string{partition1g}))
	}()
	n.driver(t)
	if diff := cmp.Diff([]string{"14@4"}, n.instances(t)); diff != "" {
		t.Errorf("instances after restart (-want +got):\n%s", diff)
	}
}

func TestMIGOverlappingPlacementIsRefused(t *testing.T) {
	n := newMIGNode(t)
	// A 2g.10gb at slices 2-3 covers the partition's slice 3.
	n.createByHand(t, gonvml.GPU_INSTANCE_PROFILE_2_SLICE, 2)
	d := n.driver(t)
	r := prepare(t, d, allocatedClaim("m", []string{partition1g}))["m"]
	if r.Err == nil {
		t.Fatal("prepare over another instance succeeded")
	}
	for _, want := range []string{partition1g, "memory slice 3", "GPU instance 1 (profile 14 at memory slices 2-3)", "never destroys instances it did not create"} {
		if !strings.Contains(r.Err.Error(), want) {
			t.Errorf("error %q does not say %q", r.Err, want)
		}
	}
	if _, ok := d.state.checkpoint.Get("m"); ok {
		t.Error("a refused claim stays recorded")
	}
	if diff := cmp.Diff([]string{"14@2"}, n.instances(t)); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
}

// TestMIGOverlapRefusedByNVMLFailsCleanly: when NVML itself refuses the
// placement (an instance appeared after the check), the prepare fails with
// NVML's reason and nothing of the claim stays.
func TestMIGOverlapRefusedByNVMLFailsCleanly(t *testing.T) {
	n := newMIGNode(t)
	d := n.driver(t)
	d.state.partitions.crashHook = func(string) {}
	err := d.state.partitions.create(context.Background(), func() *checkpoint.Claim {
		rec, err := d.state.plan(context.Background(), allocatedClaim("m", []string{partition1g}))
		if err != nil {
			t.Fatal(err)
		}
		n.createByHand(t, gonvml.GPU_INSTANCE_PROFILE_1_SLICE, 3)
		return &rec
	}())
	if err == nil || !strings.Contains(err.Error(), "placement is taken") {
		t.Errorf("error %v, want NVML's refusal of a taken placement", err)
	}
	if diff := cmp.Diff([]string{"19@3"}, n.instances(t)); diff != "" {
		t.Errorf("instances (-want +got):\n%s", diff)
	}
}

// racingMIG is the node's NVML with another party that acts just before
// prepare creates a GPU instance, after prepare found the placements free.
type racingMIG struct {
	mig.Interface
	before func(mig.Placement)
}

func (r racingMIG) CreateGPUInstance(ctx context.Context, p mig.Placement) (int, error) {
	r.before(p)
	return r.Interface.CreateGPUInstance(ctx, p)
}

// TestMIGRollbackLeavesAnotherPartysInstance: another party takes a claim's
// second placement after prepare checked it. The prepare fails, and its
// rollback destroys the instance it created at the first placement, known
// by the ID NVML returned, but not the other party's at the second, which
// matches the claim's intent there.
func TestMIGRollbackLeavesAnotherPartysInstance(t *testing.T) {
	n := newMIGNode(t)
	d := n.driver(t)
	d.state.partitions.lib = racingMIG{Interface: d.state.partitions.lib, before: func(p mig.Placement) {
		if p.Start == 4 {
			n.createByHand(t, gonvml.GPU_INSTANCE_PROFILE_1_SLICE, 4)
		}
	}}
	r := prepare(t, d, allocatedClaim("m", []string{partition1g, otherPartition1g}))["m"]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "placement is taken") {
		t.Errorf("error %v, want NVML's refusal of a taken placement", r.Err)
	}
	if _, ok := d.state.checkpoint.Get("m"); ok {
		t.Error("a failed claim stays recorded")
	}
	if diff := cmp.Diff([]string{"19@4"}, n.instances(t)); diff != "" {
		t.Errorf("instances after the rollback (-want +got):\n%s", diff)
	}
}
