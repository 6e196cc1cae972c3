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
	"os"
	"path/filepath"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	clocktesting "k8s.io/utils/clock/testing"

	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"

	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

const (
	xid48Message   = "Xid 48, a fatal GPU error; tainted gpu.prism.dev/unhealthy=xid-48:NoSchedule"
	xid79Message   = "Xid 79, the GPU fell off the bus; tainted gpu.prism.dev/unhealthy=gpu-lost:NoExecute"
	unreadableText = "NVML cannot read the GPU; tainted gpu.prism.dev/unhealthy=gpu-lost:NoExecute"
)

var ignoreLastUpdated = cmpopts.IgnoreFields(kubeletplugin.DeviceHealth{}, "LastUpdated")

// gpuHealth is a GPU of testNode as the kubelet should be told it.
func gpuHealth(name string, health kubeletplugin.HealthStatus, message string) kubeletplugin.DeviceHealth {
	return kubeletplugin.DeviceHealth{PoolName: testNode, DeviceName: name, Health: health, HealthCheckTimeout: healthLease, Message: message}
}

func healthyGPU(name string) kubeletplugin.DeviceHealth {
	return gpuHealth(name, kubeletplugin.HealthStatusHealthy, "")
}

// healthStream is one kubelet watching GPU health: WatchHealthStatus called
// as the kubelet-plugin helper calls it for each stream.
type healthStream struct {
	reports chan kubeletplugin.DeviceHealthReport
	cancel  context.CancelFunc
	done    chan struct{}
	err     error
	last    *kubeletplugin.DeviceHealthReport
}

func openHealthStream(t *testing.T, d *Driver) *healthStream {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	s := &healthStream{reports: make(chan kubeletplugin.DeviceHealthReport), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		s.err = d.WatchHealthStatus(ctx, s.reports)
	}()
	t.Cleanup(func() {
		cancel()
		<-s.done
	})
	return s
}

// next reads one report.
func (s *healthStream) next(t *testing.T, step string) kubeletplugin.DeviceHealthReport {
	t.Helper()
	select {
	case r := <-s.reports:
		s.last = &r
		return r
	case <-s.done:
		t.Fatalf("%s: WatchHealthStatus returned %v", step, s.err)
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no health report", step)
	}
	return kubeletplugin.DeviceHealthReport{}
}

// waitFor reads reports until one is want.
func (s *healthStream) waitFor(t *testing.T, step string, want []kubeletplugin.DeviceHealth) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		diff := "no report yet"
		if s.last != nil {
			if diff = cmp.Diff(want, s.last.Devices, ignoreLastUpdated); diff == "" {
				return
			}
		}
		select {
		case r := <-s.reports:
			s.last = &r
		case <-s.done:
			t.Fatalf("%s: WatchHealthStatus returned %v; last report (-want +got):\n%s", step, s.err, diff)
		case <-timeout:
			t.Fatalf("%s: last health report (-want +got):\n%s", step, diff)
		}
	}
}

// TestKubeletIsToldGPUHealth: the kubelet is told the GPUs' health as their
// taints say, when its stream opens and whenever a taint changes.
func TestKubeletIsToldGPUHealth(t *testing.T) {
	xid := func(t *testing.T, d *Driver, device string, xid uint64) {
		t.Helper()
		d.health.handleEvent(t.Context(), nvml.HealthEvent{UUID: uuidOf(t, d, device), XID: xid})
	}
	// quiet lets the GPUs go quiet for the recovery period. It is shorter
	// than healthResendEvery, so that only a change can send the report.
	quiet := func(t *testing.T, d *Driver, clock *clocktesting.FakeClock) {
		d.cfg.Health.RecoverAfter = time.Second
		clock.Step(time.Second)
		d.health.recoverQuietGPUs(t.Context())
	}
	failingNVML := &mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }}
	notWatched := "Xid events are not watched: " + nvml.WatchHealth(t.Context(), failingNVML, nil, wait.Backoff{}).Error()

	for _, tc := range []struct {
		name string
		// before runs before the stream opens; restart then opens it on a
		// restarted plugin.
		before    func(t *testing.T, d *Driver, inventory *flakyInventory)
		restart   bool
		wantFirst []kubeletplugin.DeviceHealth
		// then runs while the stream is open.
		then     func(t *testing.T, d *Driver, inventory *flakyInventory, clock *clocktesting.FakeClock)
		wantThen []kubeletplugin.DeviceHealth
	}{{
		name:      "fatal Xid",
		wantFirst: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")},
		then: func(t *testing.T, d *Driver, _ *flakyInventory, _ *clocktesting.FakeClock) {
			xid(t, d, "gpu-0", 13) // the application's fault
			xid(t, d, "gpu-1", 48)
		},
		wantThen: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, xid48Message)},
	}, {
		name:      "recovered after a quiet period",
		before:    func(t *testing.T, d *Driver, _ *flakyInventory) { xid(t, d, "gpu-0", 48) },
		wantFirst: []kubeletplugin.DeviceHealth{gpuHealth("gpu-0", kubeletplugin.HealthStatusUnhealthy, xid48Message), healthyGPU("gpu-1")},
		then: func(t *testing.T, d *Driver, _ *flakyInventory, clock *clocktesting.FakeClock) {
			quiet(t, d, clock)
		},
		wantThen: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")},
	}, {
		name:      "fell off the bus",
		wantFirst: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")},
		then: func(t *testing.T, d *Driver, _ *flakyInventory, _ *clocktesting.FakeClock) {
			xid(t, d, "gpu-1", nvml.XIDGPULost)
		},
		wantThen: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, xid79Message)},
	}, {
		name: "unreadable until NVML reads it",
		before: func(t *testing.T, d *Driver, inventory *flakyInventory) {
			inventory.setLost(1, true)
			if err := d.health.rediscover(t.Context()); err != nil {
				t.Fatal(err)
			}
		},
		wantFirst: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, unreadableText)},
		then: func(t *testing.T, d *Driver, inventory *flakyInventory, _ *clocktesting.FakeClock) {
			inventory.setLost(1, false)
			if err := d.health.rediscover(t.Context()); err != nil {
				t.Fatal(err)
			}
			if _, err := d.pool.publishIfChanged(t.Context(), false); err != nil {
				t.Fatal(err)
			}
		},
		wantThen: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")},
	}, {
		name:      "tainted before a restart",
		before:    func(t *testing.T, d *Driver, _ *flakyInventory) { xid(t, d, "gpu-1", 48) },
		restart:   true,
		wantFirst: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, xid48Message)},
		then: func(t *testing.T, d *Driver, _ *flakyInventory, clock *clocktesting.FakeClock) {
			quiet(t, d, clock)
		},
		wantThen: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")},
	}, {
		name:      "Xid events not watched",
		before:    func(t *testing.T, d *Driver, _ *flakyInventory) { xid(t, d, "gpu-1", 48) },
		wantFirst: []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, xid48Message)},
		then: func(t *testing.T, d *Driver, _ *flakyInventory, _ *clocktesting.FakeClock) {
			d.cfg.Health.NVML = failingNVML
			go d.health.watch(t.Context())
		},
		wantThen: []kubeletplugin.DeviceHealth{gpuHealth("gpu-0", kubeletplugin.HealthStatusUnknown, notWatched), gpuHealth("gpu-1", kubeletplugin.HealthStatusUnhealthy, xid48Message)},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			inventory := newFlakyInventory("t4-2.yaml")
			d, clock := healthDriver(t, dir, inventory)
			if tc.before != nil {
				tc.before(t, d, inventory)
			}
			if tc.restart {
				d, clock = healthDriver(t, dir, inventory)
			}
			s := openHealthStream(t, d)
			first := s.next(t, "stream opened")
			if diff := cmp.Diff(tc.wantFirst, first.Devices, ignoreLastUpdated); diff != "" {
				t.Errorf("first report (-want +got):\n%s", diff)
			}
			for _, dev := range first.Devices {
				if !dev.LastUpdated.Equal(clock.Now()) {
					t.Errorf("%s LastUpdated %v, want the time of the report %v", dev.DeviceName, dev.LastUpdated, clock.Now())
				}
			}
			tc.then(t, d, inventory, clock)
			s.waitFor(t, "after the change", tc.wantThen)
		})
	}
}

// TestGPUHealthIsNotOfferedWithoutTheWatch: with --health=false nothing
// watches the GPUs, so nothing can be said of their health.
func TestGPUHealthIsNotOfferedWithoutTheWatch(t *testing.T) {
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	if err := d.WatchHealthStatus(t.Context(), make(chan kubeletplugin.DeviceHealthReport)); !errors.Is(err, kubeletplugin.ErrHealthNotSupported) {
		t.Errorf("WatchHealthStatus without health watching = %v, want ErrHealthNotSupported", err)
	}
}

// TestHealthStreamsAreIndependent: each kubelet stream gets every change,
// and one that ends leaves the others running.
func TestHealthStreamsAreIndependent(t *testing.T) {
	d, _ := healthDriver(t, t.TempDir(), nil)
	first, second := openHealthStream(t, d), openHealthStream(t, d)
	healthy := []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")}
	first.waitFor(t, "first stream opened", healthy)
	second.waitFor(t, "second stream opened", healthy)

	first.cancel()
	select {
	case <-first.done:
		if first.err != nil {
			t.Errorf("WatchHealthStatus of a cancelled stream returned %v, want nil", first.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("WatchHealthStatus did not return when its stream was cancelled")
	}

	d.health.handleEvent(t.Context(), nvml.HealthEvent{UUID: uuidOf(t, d, "gpu-0"), XID: 48})
	second.waitFor(t, "Xid after the first stream ended", []kubeletplugin.DeviceHealth{gpuHealth("gpu-0", kubeletplugin.HealthStatusUnhealthy, xid48Message), healthyGPU("gpu-1")})
}

// TestHealthMonitorDoesNotWaitForTheKubelet: a kubelet that does not read
// its stream holds up neither the taints nor the other GPUs' events, and
// when it reads it gets the state as it is, not every state in between.
func TestHealthMonitorDoesNotWaitForTheKubelet(t *testing.T) {
	d, _ := healthDriver(t, t.TempDir(), nil)
	s := openHealthStream(t, d)
	uuid := uuidOf(t, d, "gpu-0")
	xids := []uint64{48, 62, 63, 64, 92}
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		for _, xid := range xids {
			d.health.handleEvent(t.Context(), nvml.HealthEvent{UUID: uuid, XID: xid})
		}
	}()
	select {
	case <-handled:
	case <-time.After(10 * time.Second):
		t.Fatal("health events waited for a kubelet that reads nothing")
	}
	want := []kubeletplugin.DeviceHealth{
		gpuHealth("gpu-0", kubeletplugin.HealthStatusUnhealthy, "Xid 92, a fatal GPU error; tainted gpu.prism.dev/unhealthy=xid-92:NoSchedule"),
		healthyGPU("gpu-1"),
	}
	// The report pending when the last change came may still go out first.
	var got []kubeletplugin.DeviceHealth
	for range 2 {
		if got = s.next(t, "kubelet reads").Devices; cmp.Equal(want, got, ignoreLastUpdated) {
			return
		}
	}
	t.Errorf("the second report read is not the current state (-want +got):\n%s", cmp.Diff(want, got, ignoreLastUpdated))
}

// TestHealthWaitsForDiscovery: a stream opened before the GPUs are known
// sends nothing rather than a node without GPUs, then their health once
// they are discovered.
func TestHealthWaitsForDiscovery(t *testing.T) {
	d, _ := healthDriver(t, t.TempDir(), nil)
	d.state.gpus.mu.Lock()
	d.state.gpus.byName = nil
	d.state.gpus.mu.Unlock()
	s := openHealthStream(t, d)
	select {
	case r := <-s.reports:
		t.Fatalf("reported %+v before the GPUs were discovered", r)
	case <-time.After(200 * time.Millisecond):
	}
	if err := d.health.rediscover(t.Context()); err != nil {
		t.Fatal(err)
	}
	d.health.republish(t.Context())
	if diff := cmp.Diff([]kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")}, s.next(t, "GPUs discovered").Devices, ignoreLastUpdated); diff != "" {
		t.Errorf("first report (-want +got):\n%s", diff)
	}
}

// TestHealthIsResentWithinTheLease: the kubelet shows a GPU's health as
// Unknown once it goes unreported for healthLease, so an unchanged state is
// sent again before that.
func TestHealthIsResentWithinTheLease(t *testing.T) {
	d, clock := healthDriver(t, t.TempDir(), nil)
	s := openHealthStream(t, d)
	want := []kubeletplugin.DeviceHealth{healthyGPU("gpu-0"), healthyGPU("gpu-1")}
	s.waitFor(t, "stream opened", want)
	if err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
		return clock.HasWaiters(), nil
	}); err != nil {
		t.Fatal("WatchHealthStatus set no timer to send again")
	}
	clock.Step(healthResendEvery)
	again := s.next(t, "resend")
	if diff := cmp.Diff(want, again.Devices, ignoreLastUpdated); diff != "" {
		t.Errorf("resent report (-want +got):\n%s", diff)
	}
	if got := again.Devices[0].LastUpdated; !got.Equal(clock.Now()) {
		t.Errorf("resent report's LastUpdated %v, want the time it was sent %v", got, clock.Now())
	}
}

// TestKubeletWatchesGPUHealth runs the plugin as it registers with the
// kubelet and watches health as the kubelet does, over the DRA socket: the
// plugin must offer the health service, and an Xid must reach the stream.
func TestKubeletWatchesGPUHealth(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	dir := t.TempDir()
	cfg := testConfig(t, "t4-2.yaml", filepath.Join(dir, "state"))
	lib, faults := nvml.SimulateFaults(simulatedNVML(t, "t4-2.yaml", ""))
	cfg.Health = &HealthConfig{NVML: lib, RecoverAfter: time.Hour}
	cfg.RegistrarDir, cfg.PluginDir = filepath.Join(dir, "registry"), filepath.Join(dir, "plugin")
	if err := os.MkdirAll(cfg.RegistrarDir, 0o750); err != nil {
		t.Fatal(err)
	}
	d, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Stop()

	conn, err := grpc.NewClient("unix://"+draSocketPath(cfg.PluginDir, ""), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	stream, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	// health is what the stream says of each GPU, as "HEALTH: message".
	health := func(r *drahealthv1.NodeWatchResourcesResponse) map[string]string {
		out := map[string]string{}
		for _, dev := range r.GetDevices() {
			out[dev.GetDevice().GetPoolName()+"/"+dev.GetDevice().GetDeviceName()] = dev.GetHealth().String() + ": " + dev.GetMessage()
		}
		return out
	}
	waitFor := func(step string, want map[string]string) {
		t.Helper()
		diff := "no report"
		for {
			r, err := stream.Recv()
			if err != nil {
				t.Fatalf("%s: %v; last report (-want +got):\n%s", step, err, diff)
			}
			if diff = cmp.Diff(want, health(r)); diff == "" {
				return
			}
		}
	}
	waitFor("stream opened", map[string]string{testNode + "/gpu-0": "HEALTHY: ", testNode + "/gpu-1": "HEALTHY: "})
	injectWhenWatched(t, faults, uuidOf(t, d, "gpu-0"), 48)
	waitFor("Xid 48 on gpu-0", map[string]string{testNode + "/gpu-0": "UNHEALTHY: " + xid48Message, testNode + "/gpu-1": "HEALTHY: "})
}
