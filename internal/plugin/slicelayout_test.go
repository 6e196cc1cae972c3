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
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// migFleet has an A100-40GB in MIG mode (gpu-0) and one that is not
// (gpu-1).
const migFleet = "testdata/mig-a100-40gb.yaml"

// migDriver runs a driver on migFleet with the MIGPartitions gate as
// given, recording its Events.
func migDriver(t *testing.T, gate bool) (*Driver, *record.FakeRecorder) {
	t.Helper()
	d := newTestDriverWith(t, "t4-2.yaml", t.TempDir(), func(c *Config) {
		c.Inventory = nvml.NewFleetInventory(migFleet, testNode)
		c.MIGPartitions = gate
	})
	recorder := record.NewFakeRecorder(100)
	useRecorder(d, recorder)
	return d, recorder
}

// modelSlices is what pkg/gpu lays out for migFleet's GPUs, as the plugin
// hands it to the ResourceSlice controller; partitioned false publishes
// every GPU whole, as before partitions existed.
func modelSlices(ctx context.Context, t *testing.T, partitioned bool) []resourceslice.Slice {
	t.Helper()
	devices, sysfs, err := nvml.NewFleetInventory(migFleet, testNode).Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	opts := gpu.PublishOptions{SysFS: sysfs}
	if !partitioned {
		for i := range devices {
			devices[i].MIG = nil
		}
		whole, err := gpu.ResourceDevices(ctx, devices, opts)
		if err != nil {
			t.Fatal(err)
		}
		return []resourceslice.Slice{{Devices: whole}}
	}
	layout, err := gpu.ResourceSlices(ctx, devices, opts)
	if err != nil {
		t.Fatal(err)
	}
	var out []resourceslice.Slice
	for _, s := range layout {
		out = append(out, resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters})
	}
	return out
}

func events(r *record.FakeRecorder) []string {
	var out []string
	for len(r.Events) > 0 {
		out = append(out, <-r.Events)
	}
	return out
}

// With MIGPartitions on, a GPU in MIG mode is published as pkg/gpu models
// it: its whole self and every partition in a slice of their own, its
// counter set in another; a MIG-capable GPU not in MIG mode stays whole
// and is reported once. With the gate off the pool is what it always was.
func TestMIGPartitionsArePublishedBehindTheGate(t *testing.T) {
	for _, tc := range []struct {
		name           string
		gate           bool
		wantPartitions int
		wantEvents     []string
	}{
		{name: "gate on", gate: true, wantPartitions: 25,
			wantEvents: []string{"Normal " + EventReasonMIGModeOff + " gpu-1 (NVIDIA A100-SXM4-40GB"}},
		{name: "gate off", gate: false, wantPartitions: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d, recorder := migDriver(t, tc.gate)
			// Twice: the second finds nothing changed and the GPU not in
			// MIG mode already reported.
			for range 2 {
				if _, err := d.pool.publishIfChanged(ctx, false); err != nil {
					t.Fatal(err)
				}
			}
			p := d.pool.publisher.(*recordingPublisher)
			if p.count() != 1 {
				t.Errorf("published %d times, want 1", p.count())
			}
			got := p.slices()
			if diff := cmp.Diff(modelSlices(ctx, t, tc.gate), got); diff != "" {
				t.Errorf("published pool differs from pkg/gpu's layout (-want +got):\n%s", diff)
			}

			partitions := 0
			for _, dev := range sliceDevices(got) {
				if strings.HasPrefix(dev.Name, "gpu-0-mig-") {
					partitions++
					if len(dev.ConsumesCounters) != 1 || dev.ConsumesCounters[0].CounterSet != "gpu-0" {
						t.Errorf("partition %s consumes %+v, want gpu-0's counter set", dev.Name, dev.ConsumesCounters)
					}
				}
				if dev.Name == "gpu-1" && len(dev.ConsumesCounters) > 0 {
					t.Errorf("gpu-1, not in MIG mode, consumes counters: %+v", dev.ConsumesCounters)
				}
			}
			if partitions != tc.wantPartitions {
				t.Errorf("published %d partitions of gpu-0, want %d", partitions, tc.wantPartitions)
			}
			if got := testutil.ToFloat64(d.metrics.publishedDevices); int(got) != len(sliceDevices(p.slices())) {
				t.Errorf("prism_plugin_published_devices = %v, want %d", got, len(sliceDevices(p.slices())))
			}

			evs := events(recorder)
			if len(evs) != len(tc.wantEvents) {
				t.Fatalf("events %q, want %d", evs, len(tc.wantEvents))
			}
			for i, want := range tc.wantEvents {
				if !strings.HasPrefix(evs[i], want) {
					t.Errorf("event %q, want one starting %q", evs[i], want)
				}
			}
		})
	}
}

// An API server without DRAPartitionableDevices (Kubernetes 1.34, 1.35)
// drops the counters; the partitions of a GPU would then all look free at
// once. The plugin says so once and publishes whole GPUs only.
func TestDroppedCountersFallBackToWholeGPUs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d, recorder := migDriver(t, true)
	if err := d.pool.publish(ctx); err != nil {
		t.Fatal(err)
	}
	events(recorder) // MIGModeOff, tested above
	p := d.pool.publisher.(*recordingPublisher)
	published := p.slices()
	counters := slices.IndexFunc(published, func(s resourceslice.Slice) bool { return len(s.SharedCounters) > 0 })
	if counters < 0 {
		t.Fatalf("no counter set published: %+v", published)
	}
	// What the ResourceSlice controller reports, for every slice the
	// server stored without what the gate governs.
	for i, s := range published {
		desired := &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: s.Devices, SharedCounters: s.SharedCounters}}
		actual := desired.DeepCopy()
		actual.Spec.SharedCounters = nil
		for j := range actual.Spec.Devices {
			actual.Spec.Devices[j].ConsumesCounters = nil
		}
		dropped := &resourceslice.DroppedFieldsError{PoolName: testNode, SliceIndex: i, DesiredSlice: desired, ActualSlice: actual}
		if len(dropped.DisabledFeatures()) == 0 {
			continue // the slice of GPUs published whole lost nothing
		}
		d.HandleError(ctx, fmt.Errorf("create ResourceSlice: %w", dropped), "publishing ResourceSlices")
	}

	if diff := cmp.Diff(modelSlices(ctx, t, false), p.slices()); diff != "" {
		t.Errorf("after the counters were dropped, the pool is not whole GPUs only (-want +got):\n%s", diff)
	}
	evs := events(recorder)
	if len(evs) != 1 || !strings.Contains(evs[0], EventReasonPartitionableDevicesDropped) || !strings.Contains(evs[0], "DRAPartitionableDevices") {
		t.Errorf("events %q, want one %s", evs, EventReasonPartitionableDevicesDropped)
	}
	if got := testutil.ToFloat64(d.metrics.apiFeatureDropped.WithLabelValues("DRAPartitionableDevices")); got != 1 {
		t.Errorf("prism_plugin_api_feature_dropped{gate=\"DRAPartitionableDevices\"} = %v, want 1", got)
	}
	// A rediscovery keeps it so.
	before := p.count()
	if _, err := d.pool.publishIfChanged(ctx, false); err != nil {
		t.Fatal(err)
	}
	if p.count() != before {
		t.Errorf("a republish without changes published partitions again")
	}
}

// A partition carries its GPU's taint: an Xid on the GPU makes every part
// of it unschedulable, and the whole GPU too.
func TestPartitionsInheritTheirGPUsTaint(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d, _ := migDriver(t, true)
	gpu0, ok := d.state.gpus.get("gpu-0")
	if !ok {
		t.Fatal("gpu-0 not discovered")
	}
	taint := newTaint("xid-48", resourceapi.DeviceTaintEffectNoExecute, time.Now())
	d.state.gpus.mu.Lock()
	d.state.gpus.unhealthy["gpu-0"] = unhealthy{uuid: gpu0.UUID, taint: taint}
	d.state.gpus.mu.Unlock()
	if err := d.pool.publish(ctx); err != nil {
		t.Fatal(err)
	}
	tainted := 0
	for _, dev := range d.pool.publisher.(*recordingPublisher).slices() {
		for _, rd := range dev.Devices {
			wantTaint := strings.HasPrefix(rd.Name, "gpu-0")
			if got := len(rd.Taints) == 1 && rd.Taints[0] == taint; got != wantTaint {
				t.Errorf("%s: taints %+v, want tainted %t", rd.Name, rd.Taints, wantTaint)
			}
			if wantTaint {
				tainted++
			}
		}
	}
	if want := 1 + len(gpu0.Partitions()); tainted != want {
		t.Errorf("%d devices tainted, want gpu-0 and its %d partitions", tainted, want-1)
	}
}
