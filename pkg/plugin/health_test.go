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
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
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
	d.clock = clock
	d.mu.clock = clock
	return d, clock
}

func uuidOf(t *testing.T, d *Driver, name string) string {
	t.Helper()
	g, ok := d.device(name)
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
	d.handleHealthEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-0"), XID: nvml.XIDGPULost})
	d.handleHealthEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-1"), XID: 48})
	published := d.slices.(*recordingPublisher)
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue || taint.Effect != resourceapi.DeviceTaintEffectNoExecute {
		t.Fatalf("gpu-0 taint %+v, want %s NoExecute", taint, lostValue)
	}

	clock.Step(time.Hour)
	d.recoverQuietGPUs(ctx)
	if taint := taintOf(published.devices(), "gpu-1"); taint != nil {
		t.Errorf("gpu-1's Xid 48 taint outlived the quiet period: %+v", taint)
	}
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue {
		t.Fatalf("the quiet period lifted gpu-lost: %+v", taint)
	}

	inventory.setLost(0, true)
	if err := d.rediscover(ctx); err != nil {
		t.Fatal(err)
	}
	d.republish(ctx)
	if taint := taintOf(published.devices(), "gpu-0"); taint == nil || taint.Value != lostValue {
		t.Fatalf("gpu-0 untainted while NVML cannot read it: %+v", taint)
	}

	inventory.setLost(0, false)
	if err := d.rediscover(ctx); err != nil {
		t.Fatal(err)
	}
	d.republish(ctx)
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
	if err := d.rediscover(ctx); err != nil {
		t.Fatalf("one unreadable GPU failed discovery: %v", err)
	}
	d.republish(ctx)
	devices := d.slices.(*recordingPublisher).devices()
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
	d.handleHealthEvent(ctx, nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-1"), XID: 48})

	restarted, _ := healthDriver(t, dir, nil)
	restarted.republish(ctx)
	taint := taintOf(restarted.slices.(*recordingPublisher).devices(), "gpu-1")
	if taint == nil || taint.Value != "xid-48" || taint.Effect != resourceapi.DeviceTaintEffectNoSchedule {
		t.Errorf("after a restart gpu-1 is published with taint %+v, want xid-48 NoSchedule", taint)
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
			d.handleHealthEvent(ctx, nvml.HealthEvent{UUID: uuids[i%2], XID: uint64(40 + i)})
		}()
		go func() {
			defer wg.Done()
			if err := d.rediscover(ctx); err != nil {
				t.Error(err)
			}
			if _, err := d.publishIfChanged(ctx, false); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	want, err := d.resourceDevices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := d.slices.(*recordingPublisher).devices()
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			d, _ := healthDriver(t, t.TempDir(), nil)
			recorder := record.NewFakeRecorder(10)
			d.recorder = recorder
			devices, err := d.resourceDevices(ctx)
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
		d.recorder = recorder
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
