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
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// Another 1g.5gb of the migNode's A100-40GB, beside partition1g.
const otherPartition1g = "gpu-0-mig-1g5gb-4"

// migHealthDriver starts a driver on the MIG node with partitions published
// and health handled on a fake clock, its Events recorded.
func migHealthDriver(t *testing.T, n migNode) (*Driver, *clocktesting.FakeClock, *record.FakeRecorder) {
	t.Helper()
	d := newTestDriverWith(t, "t4-2.yaml", n.dir, func(c *Config) {
		c.Inventory = nvml.NewFleetInventory(n.fleet, testNode)
		if err := cdi.MakeFakeMIGCaps(filepath.Join(n.dir, "driver-root"), []int{0}); err != nil {
			t.Fatal(err)
		}
		c.MIG = mig.New(n.simulated(t))
		c.MIGPartitions = true
		c.Health = &HealthConfig{RecoverAfter: time.Minute, IgnoredXIDs: map[uint64]bool{13: true}}
	})
	clock := clocktesting.NewFakeClock(time.Now())
	useClock(d, clock)
	recorder := record.NewFakeRecorder(100)
	useRecorder(d, recorder)
	return d, clock, recorder
}

// gpuInstanceOf is the ID of the GPU instance prepare created for a claim's
// only device, as the checkpoint records it.
func gpuInstanceOf(t *testing.T, d *Driver, uid string) uint32 {
	t.Helper()
	rec, ok := d.state.checkpoint.Get(uid)
	if !ok || len(rec.Devices) != 1 || rec.Devices[0].MIG == nil || !rec.Devices[0].MIG.Created {
		t.Fatalf("claim %s has no created MIG instance recorded: %+v", uid, rec)
	}
	return uint32(rec.Devices[0].MIG.GPUInstanceID)
}

// taintedDevices are the published devices that carry a taint, by name,
// with the taint's value.
func taintedDevices(d *Driver) map[string]string {
	out := map[string]string{}
	for _, dev := range sliceDevices(d.pool.publisher.(*recordingPublisher).slices()) {
		if len(dev.Taints) > 0 {
			out[dev.Name] = dev.Taints[0].Value
		}
	}
	return out
}

// wholeGPU0 is gpu-0 and each of its partitions with this taint value.
func wholeGPU0(t *testing.T, d *Driver, value string) map[string]string {
	t.Helper()
	gpu0, ok := d.state.gpus.get("gpu-0")
	if !ok {
		t.Fatal("gpu-0 not discovered")
	}
	out := map[string]string{"gpu-0": value}
	for _, p := range gpu0.Partitions() {
		out[p.Name()] = value
	}
	return out
}

// An Xid that NVML attributes to a GPU instance taints the partition whose
// prepared instance it is, and nothing else: not its GPU, not the other
// prepared partition. One that names no instance, or an instance Prism did
// not create, taints the whole GPU, and so every partition.
func TestXidOfAGPUInstanceTaintsItsPartition(t *testing.T) {
	for _, tc := range []struct {
		name string
		// gpuInstance names the instance of the event; ours is the
		// instance prepared for partition1g.
		gpuInstance func(ours uint32) *uint32
		xid         uint64
		// want is the published taints, by device name.
		want func(t *testing.T, d *Driver) map[string]string
		// wantRecorded is the checkpoint's taint records, by device name.
		wantRecorded []string
		// wantEvent is the start of the GPUUnhealthy Event's message.
		wantEvent string
	}{{
		name:         "GPU instance of a prepared partition",
		gpuInstance:  func(ours uint32) *uint32 { return &ours },
		xid:          94,
		want:         func(*testing.T, *Driver) map[string]string { return map[string]string{partition1g: "xid-94"} },
		wantRecorded: []string{partition1g},
		wantEvent:    "Warning GPUUnhealthy MIG partition " + partition1g + " (GPU instance ",
	}, {
		name:         "no GPU instance",
		gpuInstance:  func(uint32) *uint32 { return nil },
		xid:          48,
		want:         func(t *testing.T, d *Driver) map[string]string { return wholeGPU0(t, d, "xid-48") },
		wantRecorded: []string{"gpu-0"},
		wantEvent:    "Warning GPUUnhealthy GPU gpu-0 (",
	}, {
		name:         "GPU instance Prism does not know",
		gpuInstance:  func(uint32) *uint32 { return ptr.To[uint32](42) },
		xid:          94,
		want:         func(t *testing.T, d *Driver) map[string]string { return wholeGPU0(t, d, "xid-94") },
		wantRecorded: []string{"gpu-0"},
		wantEvent:    "Warning GPUUnhealthy GPU gpu-0 (",
	}, {
		name:         "GPU lost, naming a prepared partition's instance",
		gpuInstance:  func(ours uint32) *uint32 { return &ours },
		xid:          nvml.XIDGPULost,
		want:         func(t *testing.T, d *Driver) map[string]string { return wholeGPU0(t, d, lostValue) },
		wantRecorded: []string{"gpu-0"},
		wantEvent:    "Warning GPUUnhealthy GPU gpu-0 (",
	}, {
		name:        "application Xid of a prepared partition",
		gpuInstance: func(ours uint32) *uint32 { return &ours },
		xid:         13,
		want:        func(*testing.T, *Driver) map[string]string { return map[string]string{} },
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			n := newMIGNode(t)
			d, _, recorder := migHealthDriver(t, n)
			for uid, partition := range map[string]string{"m1": partition1g, "m2": otherPartition1g} {
				if r := prepare(t, d, allocatedClaim(uid, []string{partition}))[types.UID(uid)]; r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			ours, theirs := gpuInstanceOf(t, d, "m1"), gpuInstanceOf(t, d, "m2")
			if ours == theirs {
				t.Fatalf("both partitions have GPU instance %d", ours)
			}

			d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-0"), XID: tc.xid, GPUInstance: tc.gpuInstance(ours)})

			if diff := cmp.Diff(tc.want(t, d), taintedDevices(d)); diff != "" {
				t.Errorf("published taints (-want +got):\n%s", diff)
			}
			recorded := slices.Sorted(maps.Keys(d.state.checkpoint.Taints()))
			if diff := cmp.Diff(tc.wantRecorded, recorded, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("taints in the checkpoint (-want +got):\n%s", diff)
			}
			for name, taint := range d.state.checkpoint.Taints() {
				if taint.UUID != uuidOf(t, d, "gpu-0") {
					t.Errorf("taint of %s recorded for GPU %q, want gpu-0's %s", name, taint.UUID, uuidOf(t, d, "gpu-0"))
				}
			}
			got := events(recorder)
			if tc.wantEvent == "" {
				if len(got) != 0 {
					t.Errorf("Events %q, want none", got)
				}
				return
			}
			if len(got) != 1 || !strings.HasPrefix(got[0], tc.wantEvent) {
				t.Errorf("Events %q, want one starting %q", got, tc.wantEvent)
			}
		})
	}
}

// A partition's taint is kept like a GPU's: it survives a restart of the
// plugin, still on the partition alone, and is lifted after the quiet
// period. While its GPU is tainted too, the GPU's taint is what the
// partition carries.
func TestPartitionTaintSurvivesRestartAndRecovers(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	n := newMIGNode(t)
	d, _, _ := migHealthDriver(t, n)
	if r := prepare(t, d, allocatedClaim("m1", []string{partition1g}))["m1"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	uuid := uuidOf(t, d, "gpu-0")
	d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuid, XID: 94, GPUInstance: ptr.To(gpuInstanceOf(t, d, "m1"))})

	restarted, clock, _ := migHealthDriver(t, n)
	if err := restarted.pool.publish(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{partition1g: "xid-94"}, taintedDevices(restarted)); diff != "" {
		t.Errorf("published taints after a restart (-want +got):\n%s", diff)
	}

	restarted.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuid, XID: 48})
	if diff := cmp.Diff(wholeGPU0(t, restarted, "xid-48"), taintedDevices(restarted)); diff != "" {
		t.Errorf("published taints with the GPU tainted too (-want +got):\n%s", diff)
	}

	clock.Step(time.Hour)
	restarted.health.recoverQuietGPUs(ctx)
	if got := taintedDevices(restarted); len(got) != 0 {
		t.Errorf("taints outlived the quiet period: %v", got)
	}
	if got := restarted.state.checkpoint.Taints(); len(got) != 0 {
		t.Errorf("checkpoint still records taints after the quiet period: %v", got)
	}
}
