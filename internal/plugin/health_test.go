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
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// flakyInventory is a fleet whose GPUs can be made unreadable, as NVML
// answers for a GPU that fell off the bus.
type flakyInventory struct {
	fleet nvml.Inventory
	mu    sync.Mutex
	lost  map[int]bool
}

func newFlakyInventory(fleetFile string) *flakyInventory {
	return &flakyInventory{fleet: nvml.NewFleetInventory(filepath.Join("..", "..", "demo", "fleets", fleetFile), testNode), lost: map[int]bool{}}
}

func (f *flakyInventory) setLost(index int, lost bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lost[index] = lost
}

func (f *flakyInventory) Read(ctx context.Context) ([]gpu.Device, fs.ReadLinkFS, error) {
	devices, sysfs, err := f.fleet.Read(ctx)
	if err != nil {
		return nil, nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var readable []gpu.Device
	unreadable := &nvml.UnreadableError{GPUs: map[int]error{}}
	for _, d := range devices {
		if f.lost[d.Index] {
			unreadable.GPUs[d.Index] = errors.New("getting UUID: GPU is lost")
			continue
		}
		readable = append(readable, d)
	}
	if len(unreadable.GPUs) > 0 {
		return readable, sysfs, unreadable
	}
	return readable, sysfs, nil
}

func taintOf(devices []resourceapi.Device, name string) *resourceapi.DeviceTaint {
	for _, d := range devices {
		if d.Name == name && len(d.Taints) > 0 {
			return &d.Taints[0]
		}
	}
	return nil
}

func healthDriver(t *testing.T, dir string, inventory nvml.Inventory) (*Driver, *clocktesting.FakeClock) {
	t.Helper()
	d := newTestDriverWith(t, "t4-2.yaml", dir, func(c *Config) {
		if inventory != nil {
			c.Inventory = inventory
		}
		c.Health = &HealthConfig{RecoverAfter: time.Minute, IgnoredXIDs: map[uint64]bool{13: true}}
	})
	clock := clocktesting.NewFakeClock(time.Now())
	useClock(d, clock)
	return d, clock
}

// rediscoverAndPublish reads the GPUs again and publishes the slice, as a
// round of rediscovery that found a change does.
func rediscoverAndPublish(ctx context.Context, t *testing.T, d *Driver) {
	t.Helper()
	if err := d.health.rediscover(ctx); err != nil {
		t.Fatal(err)
	}
	d.health.republish(ctx)
}

func uuidOf(t *testing.T, d *Driver, name string) string {
	t.Helper()
	g, ok := d.state.gpus.get(name)
	if !ok {
		t.Fatalf("no device %s", name)
	}
	return g.UUID
}

// TestLostGPUStaysTaintedUntilNVMLReadsIt: a quiet period lifts an Xid's
// NoSchedule taint but not gpu-lost, which only a successful read lifts.
func TestLostGPUStaysTaintedUntilNVMLReadsIt(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	inventory := newFlakyInventory("t4-2.yaml")
	d, clock := healthDriver(t, t.TempDir(), inventory)
	d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-0"), XID: nvml.XIDGPULost})
	d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-1"), XID: 48})
	published := d.pool.publisher.(*recordingPublisher)
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue || taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("gpu-0 taint %+v, want %s NoExecute", taint, lostValue)
	}

	clock.Step(time.Hour)
	d.health.recoverQuietGPUs(ctx)
	if taint := taintOf(published.devices(), "gpu-1"); taint != nil {
		t.Errorf("gpu-1's Xid 48 taint outlived the quiet period: %+v", taint)
	}
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue {
		t.Fatalf("the quiet period lifted gpu-lost: %+v", taint)
	}

	inventory.setLost(0, true)
	rediscoverAndPublish(ctx, t, d)
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue {
		t.Fatalf("gpu-0 untainted while NVML cannot read it: %+v", taint)
	}

	inventory.setLost(0, false)
	rediscoverAndPublish(ctx, t, d)
	if taint := taintOf(published.devices(), "gpu-0"); taint != nil {
		t.Errorf("gpu-0 still tainted after NVML read it again: %+v", taint)
	}
}

// TestUnreadableGPUIsTaintedAndTheRestPublished: a GPU NVML stops reading
// does not fail discovery; it stays published, tainted lost.
func TestUnreadableGPUIsTaintedAndTheRestPublished(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	inventory := newFlakyInventory("t4-2.yaml")
	d, _ := healthDriver(t, t.TempDir(), inventory)
	inventory.setLost(1, true)
	if err := d.health.rediscover(ctx); err != nil {
		t.Fatalf("one unreadable GPU failed discovery: %v", err)
	}
	d.health.republish(ctx)
	devices := d.pool.publisher.(*recordingPublisher).devices()
	if len(devices) != 2 {
		t.Fatalf("published %d devices, want both", len(devices))
	}
	if taint := taintOf(devices, "gpu-1"); taint == nil || taint.Value != lostValue || taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Errorf("unreadable gpu-1 taint %+v, want %s NoExecute", taint, lostValue)
	}
	if taint := taintOf(devices, "gpu-0"); taint != nil {
		t.Errorf("readable gpu-0 tainted: %+v", taint)
	}
	waitForEvent(t, d.cfg.KubeClient, "GPUUnhealthy")
}

// TestTaintsSurviveARestart: a restarted plugin (or one killed for memory)
// publishes the GPUs it had tainted still tainted.
func TestTaintsSurviveARestart(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	d, _ := healthDriver(t, dir, nil)
	d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-1"), XID: 48})

	restarted, _ := healthDriver(t, dir, nil)
	restarted.health.republish(ctx)
	taint := taintOf(restarted.pool.publisher.(*recordingPublisher).devices(), "gpu-1")
	if taint == nil || taint.Value != "xid-48" || taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("after a restart gpu-1 is published with taint %+v, want xid-48 NoSchedule", taint)
	}
}

// signallingPublisher is a recordingPublisher that says when it published,
// for tests that wait on the health watcher.
type signallingPublisher struct {
	recordingPublisher
	published chan struct{}
}

func newSignallingPublisher() *signallingPublisher {
	return &signallingPublisher{published: make(chan struct{}, 1)}
}

func (p *signallingPublisher) PublishResources(ctx context.Context, r resourceslice.DriverResources) error {
	err := p.recordingPublisher.PublishResources(ctx, r)
	select {
	case p.published <- struct{}{}:
	default:
	}
	return err
}

// publishedTaints are the published devices' taints as "value:effect", by
// device name; an untainted device is "".
func publishedTaints(devices []resourceapi.Device) map[string]string {
	out := map[string]string{}
	for _, d := range devices {
		out[d.Name] = ""
		for _, t := range d.Taints {
			out[d.Name] = t.Value + ":" + string(t.Effect)
		}
	}
	return out
}

// waitForTaints waits until the published taints are want.
func (p *signallingPublisher) waitForTaints(t *testing.T, step string, want map[string]string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		diff := cmp.Diff(want, publishedTaints(p.devices()))
		if diff == "" {
			return
		}
		select {
		case <-p.published:
		case <-timeout:
			t.Fatalf("%s: published taints (-want +got):\n%s", step, diff)
		}
	}
}

// TestHealthWatchOutlivesAnUnreadableGPU: a GPU whose handle or UUID the
// health watcher cannot read at start is tainted lost, the other GPUs'
// Xids still taint them, and the GPU is watched once it reads.
func TestHealthWatchOutlivesAnUnreadableGPU(t *testing.T) {
	for name, break_ := range map[string]func(sim *nvml.Simulated, broken *atomic.Bool){
		"handle": func(sim *nvml.Simulated, broken *atomic.Bool) {
			handle := sim.DeviceGetHandleByIndexFunc
			sim.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
				if i == 1 && broken.Load() {
					return nil, gonvml.ERROR_GPU_IS_LOST
				}
				return handle(i)
			}
		},
		"UUID": func(sim *nvml.Simulated, broken *atomic.Bool) {
			uuid := sim.Devices()[1].GetUUIDFunc
			sim.Devices()[1].GetUUIDFunc = func() (string, gonvml.Return) {
				if broken.Load() {
					return "", gonvml.ERROR_UNKNOWN
				}
				return uuid()
			}
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ctx := ktesting.NewTestContext(t)
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			d, _ := healthDriver(t, t.TempDir(), nil)
			published := newSignallingPublisher()
			d.pool.publisher = published
			sim := simulatedNVML(t, "t4-2.yaml", "")
			lib, faults := nvml.SimulateFaults(sim)
			var broken atomic.Bool
			broken.Store(true)
			break_(sim, &broken)
			d.cfg.Health.NVML = lib
			d.cfg.Health.Retry = wait.Backoff{Duration: time.Millisecond}
			uuid0, uuid1 := uuidOf(t, d, "gpu-0"), uuidOf(t, d, "gpu-1")
			go d.health.watch(ctx)

			published.waitForTaints(t, "gpu-1 unreadable", map[string]string{"gpu-0": "", "gpu-1": "gpu-lost:NoExecute"})
			injectWhenWatched(t, faults, uuid0, 48)
			published.waitForTaints(t, "Xid on gpu-0", map[string]string{"gpu-0": "xid-48:NoSchedule", "gpu-1": "gpu-lost:NoExecute"})

			broken.Store(false)
			// Rediscovery reads gpu-1 again and lifts gpu-lost; the watcher
			// has retried it meanwhile and reports its Xids.
			rediscoverAndPublish(ctx, t, d)
			published.waitForTaints(t, "gpu-1 read again", map[string]string{"gpu-0": "xid-48:NoSchedule", "gpu-1": ""})
			injectWhenWatched(t, faults, uuid1, 48)
			published.waitForTaints(t, "Xid on gpu-1", map[string]string{"gpu-0": "xid-48:NoSchedule", "gpu-1": "xid-48:NoSchedule"})
		})
	}
}

// waitForGPUEvent waits for a GPUUnhealthy event about the device.
func waitForGPUEvent(t *testing.T, client kubernetes.Interface, device string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var seen []string
	err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range evs.Items {
			seen = append(seen, e.Reason+": "+e.Message)
			if e.Reason == "GPUUnhealthy" && strings.HasPrefix(e.Message, "GPU "+device+" ") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no GPUUnhealthy event for %s (%v); events: %q", device, err, seen)
	}
}

// injectWhenWatched raises an Xid once the GPU is registered for events.
func injectWhenWatched(t *testing.T, faults *nvml.Faults, uuid string, xid uint64) {
	t.Helper()
	select {
	case <-faults.Registered(uuid):
	case <-time.After(10 * time.Second):
		t.Fatalf("GPU %s was never registered for Xid events", uuid)
	}
	if err := faults.InjectXID(uuid, xid); err != nil {
		t.Fatal(err)
	}
}

// TestUnreadableGPUStaysPublishedAfterARestart: a GPU that NVML cannot read
// after a restart stays published, tainted lost, if the checkpoint knows
// it, so that pods on it are still evicted; once NVML reads it, it is
// published in full and untainted again.
func TestUnreadableGPUStaysPublishedAfterARestart(t *testing.T) {
	ignoreTime := cmpopts.IgnoreFields(resourceapi.DeviceTaint{}, "TimeAdded")
	lost := []resourceapi.DeviceTaint{{Key: TaintKey, Value: lostValue, Effect: resourceapi.DeviceTaintEffectNoExecute}}
	for _, tc := range []struct {
		name string
		// before is what the plugin saw before the restart.
		before func(t *testing.T, d *Driver, inventory *flakyInventory)
		// want is gpu-1 as published after the restart; nil for none.
		want func(uuid string) *resourceapi.Device
		// wantEvent is whether the restart announces gpu-1; a gpu-lost
		// taint from before the restart was announced then.
		wantEvent bool
	}{{
		name: "lost before the restart",
		before: func(t *testing.T, d *Driver, inventory *flakyInventory) {
			inventory.setLost(1, true)
			if err := d.health.rediscover(t.Context()); err != nil {
				t.Fatal(err)
			}
		},
		want: func(uuid string) *resourceapi.Device {
			return &resourceapi.Device{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"gpu.prism.dev/index": {IntValue: ptr.To[int64](1)},
				"gpu.prism.dev/uuid":  {StringValue: ptr.To(uuid)},
			}, Taints: lost}
		},
	}, {
		name: "Xid before the restart",
		before: func(t *testing.T, d *Driver, _ *flakyInventory) {
			d.health.handleEvent(t.Context(), nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-1"), XID: 48})
		},
		want: func(uuid string) *resourceapi.Device {
			return &resourceapi.Device{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"gpu.prism.dev/index": {IntValue: ptr.To[int64](1)},
				"gpu.prism.dev/uuid":  {StringValue: ptr.To(uuid)},
			}, Taints: lost}
		},
		wantEvent: true,
	}, {
		name: "healthy with a prepared claim before the restart",
		before: func(t *testing.T, d *Driver, _ *flakyInventory) {
			prepare(t, d, allocatedClaim("uid-1", []string{"gpu-1"}))
		},
		want: func(string) *resourceapi.Device {
			return &resourceapi.Device{Name: "gpu-1", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"gpu.prism.dev/index": {IntValue: ptr.To[int64](1)},
			}, Taints: lost}
		},
		wantEvent: true,
	}, {
		// Nothing to evict, and nothing to publish it by: it is announced,
		// and published once it reads.
		name:      "healthy and unused before the restart",
		before:    func(*testing.T, *Driver, *flakyInventory) {},
		want:      func(string) *resourceapi.Device { return nil },
		wantEvent: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			dir := t.TempDir()
			inventory := newFlakyInventory("t4-2.yaml")
			d, _ := healthDriver(t, dir, inventory)
			uuid := uuidOf(t, d, "gpu-1")
			tc.before(t, d, inventory)

			inventory.setLost(1, true)
			restarted, _ := healthDriver(t, dir, inventory)
			restarted.health.republish(ctx)
			devices := restarted.pool.publisher.(*recordingPublisher).devices()
			var got *resourceapi.Device
			for i := range devices {
				if devices[i].Name == "gpu-1" {
					got = &devices[i]
				}
			}
			if diff := cmp.Diff(tc.want(uuid), got, ignoreTime); diff != "" {
				t.Errorf("gpu-1 published after a restart (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]string{"gpu-0": ""}, publishedTaints(slices.DeleteFunc(slices.Clone(devices), func(d resourceapi.Device) bool { return d.Name == "gpu-1" }))); diff != "" {
				t.Errorf("the readable GPU after a restart (-want +got):\n%s", diff)
			}
			if tc.wantEvent {
				waitForGPUEvent(t, restarted.cfg.KubeClient, "gpu-1")
			}

			inventory.setLost(1, false)
			rediscoverAndPublish(ctx, t, restarted)
			devices = restarted.pool.publisher.(*recordingPublisher).devices()
			if diff := cmp.Diff(map[string]string{"gpu-0": "", "gpu-1": ""}, publishedTaints(devices)); diff != "" {
				t.Errorf("once NVML reads gpu-1 again (-want +got):\n%s", diff)
			}
			if _, read := devices[len(devices)-1].Attributes["gpu.prism.dev/productName"]; !read {
				t.Errorf("once NVML reads gpu-1 again it is published as %+v, want all it read", devices[len(devices)-1])
			}
		})
	}
}

// TestConcurrentPublishesKeepTheNewestTaints races health events against
// rediscovery; whatever the interleaving, the last publication carries
// every taint. Run with -race.
func TestConcurrentPublishesKeepTheNewestTaints(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d, _ := healthDriver(t, t.TempDir(), nil)
	uuids := []string{uuidOf(t, d, "gpu-0"), uuidOf(t, d, "gpu-1")}
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(2)
		go func() {
			defer wg.Done()
			d.health.handleEvent(ctx, nvml.HealthEvent{UUID: uuids[i%2], XID: uint64(40 + i)})
		}()
		go func() {
			defer wg.Done()
			if err := d.health.rediscover(ctx); err != nil {
				t.Error(err)
			}
			if _, err := d.pool.publishIfChanged(ctx, false); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	want, err := d.pool.resourceDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := d.pool.publisher.(*recordingPublisher).devices()
	for _, name := range []string{"gpu-0", "gpu-1"} {
		w, g := taintOf(want, name), taintOf(got, name)
		if w == nil || g == nil || w.Value != g.Value {
			t.Errorf("%s: published taint %+v, current %+v", name, g, w)
		}
	}
}

// TestDroppedFeaturesAreReported: an API server with a feature gate off
// stores the slice without the fields the gate governs (device taints,
// shareable GPUs), and the ResourceSlice controller hands the plugin a
// DroppedFieldsError; the plugin says so once per gate, and only for what
// was dropped.
func TestDroppedFeaturesAreReported(t *testing.T) {
	for _, tc := range []struct {
		name       string
		use        func(*resourceapi.Device)
		gate       string
		wantReason string
	}{
		{"taints dropped", taint, "DRADeviceTaints", EventReasonDeviceTaintsDropped},
		{"sharing dropped", shareable, "DRAConsumableCapacity", EventReasonConsumableCapacityDropped},
		{"partition counters dropped", consumesCounters, "DRAPartitionableDevices", EventReasonPartitionableDevicesDropped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d, _ := healthDriver(t, t.TempDir(), nil)
			recorder := record.NewFakeRecorder(10)
			useRecorder(d, recorder)
			devices, err := d.pool.resourceDevices(ctx)
			if err != nil {
				t.Fatal(err)
			}
			desired := slices.Clone(devices)
			tc.use(&desired[0])
			dropped := &resourceslice.DroppedFieldsError{
				PoolName:     testNode,
				DesiredSlice: &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: desired}},
				ActualSlice:  &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: devices}},
			}
			// As the kubelet-plugin helper passes it: wrapped, and again
			// at every publication.
			for range 3 {
				d.HandleError(ctx, fmt.Errorf("publish: %w", dropped), "publishing ResourceSlices")
			}

			var events []string
			for len(recorder.Events) > 0 {
				events = append(events, <-recorder.Events)
			}
			if len(events) != 1 || !strings.Contains(events[0], tc.wantReason) || !strings.Contains(events[0], tc.gate) {
				t.Errorf("events %q, want one %s event naming %s", events, tc.wantReason, tc.gate)
			}
			if got := testutil.ToFloat64(d.metrics.apiFeatureDropped.WithLabelValues(tc.gate)); got != 1 {
				t.Errorf("prism_plugin_api_feature_dropped{gate=%q} = %v, want 1", tc.gate, got)
			}
			if got := testutil.CollectAndCount(d.metrics.apiFeatureDropped); got != 1 {
				t.Errorf("%d gates reported dropped, want only %s", got, tc.gate)
			}
			if got := testutil.ToFloat64(d.metrics.claimErrors.WithLabelValues("background", "helper")); got != 0 {
				t.Errorf("dropped fields counted as %v helper errors, want 0", got)
			}
		})
	}

	t.Run("other errors are not dropped fields", func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		d, _ := healthDriver(t, t.TempDir(), nil)
		recorder := record.NewFakeRecorder(10)
		useRecorder(d, recorder)
		d.HandleError(ctx, errors.New("slice invalid"), "publishing ResourceSlices")
		if len(recorder.Events) != 0 || testutil.CollectAndCount(d.metrics.apiFeatureDropped) != 0 {
			t.Error("a plain publishing error was reported as a dropped feature")
		}
		if got := testutil.ToFloat64(d.metrics.claimErrors.WithLabelValues("background", "helper")); got != 1 {
			t.Errorf("helper errors = %v, want 1", got)
		}
	})
}

func taint(d *resourceapi.Device) {
	d.Taints = []resourceapi.DeviceTaint{newTaint("xid-48", resourceapi.DeviceTaintEffectNoSchedule, time.Now())}
}

func shareable(d *resourceapi.Device) { d.AllowMultipleAllocations = ptr.To(true) }

func consumesCounters(d *resourceapi.Device) {
	d.ConsumesCounters = []resourceapi.DeviceCounterConsumption{{CounterSet: d.Name, Counters: map[string]resourceapi.Counter{"memory-slice-0": {Value: resource.MustParse("1")}}}}
}
