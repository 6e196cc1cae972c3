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
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// mpsDriver is a test driver whose driver root holds the stand-in
// nvidia-cuda-mps-control; start it again on the same state directory to
// restart the plugin.
type mpsDriver struct {
	state, driverRoot, record string
}

func newMPSDriver(t *testing.T) *mpsDriver {
	t.Helper()
	m := &mpsDriver{state: t.TempDir()}
	m.driverRoot, m.record = mpstest.DriverRoot(t)
	// Where this host lets the plugin bound pipe directories with a tmpfs,
	// a test that leaves its daemon running leaves the mount too.
	mpstest.UnmountAtCleanup(t, m.state)
	// No daemon outlives its test.
	t.Cleanup(func() {
		for _, e := range mpstest.Read(t, m.record) {
			if e.Role == "daemon" && e.Event == "start" {
				_ = syscall.Kill(-e.PID, syscall.SIGKILL)
			}
		}
	})
	return m
}

func (m *mpsDriver) start(t *testing.T) *Driver {
	t.Helper()
	d := newTestDriverWith(t, "h100-sxm-8.yaml", m.state, func(c *Config) { c.MPSDriverRoot = m.driverRoot })
	t.Cleanup(d.state.checkpoint.Close)
	return d
}

// daemonEvents are what the stand-in's daemons recorded of their lives, as
// "event command", by the daemon's key (see shareDaemon).
func (m *mpsDriver) daemonEvents(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, e := range mpstest.Read(t, m.record) {
		if e.Role == "daemon" && (e.Event == "start" || e.Event == "command" || e.Event == "exit") {
			key := filepath.Base(filepath.Dir(e.PipeDir))
			out[key] = append(out[key], e.Event+" "+e.Command)
		}
	}
	return out
}

// shareDaemon is the key of the daemon of a claim's share of gpu-0.
func shareDaemon(uid string) string { return uid + "-gpu-0" }

// limited are a daemon's records from its start through its limits being
// set, and read back: a cap of percent of the SMs where percent is not 0,
// and mib MiB.
func limited(percent, mib int) []string {
	events := []string{"start "}
	if percent != 0 {
		events = append(events,
			fmt.Sprintf("command set_default_active_thread_percentage %d", percent),
			"command get_default_active_thread_percentage")
	}
	return append(events,
		fmt.Sprintf("command set_default_device_pinned_mem_limit 0 %dM", mib),
		"command get_default_device_pinned_mem_limit 0")
}

// computeShare is a claim allocated a share of gpu-0: per cent of its SMs
// and an amount of memory.
func computeShare(uid string, percent int64, memory string) *resourceapi.ResourceClaim {
	c := sharedClaim(uid, memory)
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity[gpuv1alpha1.ComputeCapacity.Qualified()] = *resource.NewQuantity(percent, resource.DecimalSI)
	return c
}

// cappedShare is computeShare whose GpuConfig caps its SMs at capPercent.
func cappedShare(uid string, percent, capPercent int64, memory string) *resourceapi.ResourceClaim {
	c := computeShare(uid, percent, memory)
	c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config,
		opaque(fmt.Sprintf(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimitPercent":%d}}`, capPercent)))
	return c
}

func unprepare(t *testing.T, d *Driver, uid string) {
	t.Helper()
	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
	if err != nil || res[types.UID(uid)] != nil {
		t.Fatalf("unprepare %s: %v %v", uid, err, res[types.UID(uid)])
	}
}

// deviceEdits reads the container edits of the claim's gpu-0 from its CDI
// spec on disk.
func deviceEdits(t *testing.T, state, uid string) cdispec.ContainerEdits {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(state, "cdi", cdi.SpecFileName(uid)))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	for _, dev := range spec.Devices {
		if dev.Name == uid+"-gpu-0" || len(spec.Devices) == 1 {
			return dev.ContainerEdits
		}
	}
	t.Fatalf("no gpu-0 in the spec of claim %s: %s", uid, raw)
	return cdispec.ContainerEdits{}
}

// TestEachShareHasADaemonOfItsOwn: two shares of one GPU each get a daemon
// of their own, whose defaults are the share's limits, so that MPS itself
// holds each share to them: its memory, and a cap on its SMs only where its
// config asks for one; each daemon stops with its share.
func TestEachShareHasADaemonOfItsOwn(t *testing.T) {
	m := newMPSDriver(t)
	d := m.start(t)
	for _, c := range []*resourceapi.ResourceClaim{cappedShare("a", 45, 45, "8Gi"), computeShare("b", 20, "4Gi")} {
		if r := prepare(t, d, c)[c.UID]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	g, _ := d.state.gpus.get("gpu-0")
	daemons := d.state.checkpoint.MPSDaemons()
	for key, want := range map[string]gpuv1alpha1.Share{
		shareDaemon("a"): {ComputePercent: 45, MemoryBytes: 8 << 30},
		shareDaemon("b"): {MemoryBytes: 4 << 30},
	} {
		if rec := daemons[key]; rec.PID == 0 || rec.UUID != g.UUID || rec.Limits != want {
			t.Errorf("daemon %s: %+v, want one running on %s with limits %v", key, rec, g.UUID, want)
		}
	}
	if len(daemons) != 2 {
		t.Errorf("daemons after two shares of gpu-0: %v, want two", slices.Sorted(maps.Keys(daemons)))
	}
	unprepare(t, d, "a")
	want := map[string][]string{
		shareDaemon("a"): append(limited(45, 8192), "command quit", "exit "),
		shareDaemon("b"): limited(0, 4096),
	}
	if diff := cmp.Diff(want, m.daemonEvents(t)); diff != "" {
		t.Errorf("daemons after the first share left (-want +got):\n%s", diff)
	}
	unprepare(t, d, "b")
	if got := m.daemonEvents(t)[shareDaemon("b")]; !slices.Equal(got[len(got)-2:], []string{"command quit", "exit "}) {
		t.Errorf("the second share's daemon after it left: %v, want it told to quit", got)
	}
	if got := d.state.checkpoint.MPSDaemons(); len(got) != 0 {
		t.Errorf("daemons recorded after the last share: %+v", got)
	}
	for _, uid := range []string{"a", "b"} {
		if _, err := os.Stat(filepath.Join(m.state, "mps", shareDaemon(uid))); !os.IsNotExist(err) {
			t.Errorf("the directories of %s's daemon remain: %v", uid, err)
		}
	}
}

// TestMPSShareEnvironment: a hand-worked share, 45 % of the SMs and 8 GiB,
// reaches the container as MPS's own variables: its memory limit, and no
// cap on its SMs, which its config does not ask for. A restarted plugin
// adopts the daemon and writes a lost spec again identically.
func TestMPSShareEnvironment(t *testing.T) {
	m := newMPSDriver(t)
	d := m.start(t)
	if r := prepare(t, d, computeShare("a", 45, "8Gi"))["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	key := shareDaemon("a")
	options := []string{"rw", "nosuid", "nodev", "noexec", "bind"}
	want := cdispec.ContainerEdits{
		Env: []string{
			"PRISM_GPU_MEMORY_LIMIT=8589934592",
			"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
		},
		Mounts: []*cdispec.Mount{
			{HostPath: filepath.Join(m.state, "mps", key, "pipe"), ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: options},
			{HostPath: filepath.Join(m.state, "mps", key, "shm"), ContainerPath: "/dev/shm", Type: "bind", Options: options},
		},
	}
	got := deviceEdits(t, m.state, "a")
	// The device node and anything else the simulated source adds are not
	// this test's business.
	got.DeviceNodes, got.Hooks = nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container edits of the share (-want +got):\n%s", diff)
	}
	before := d.state.checkpoint.MPSDaemons()[key]

	// A crash loses the spec; the restarted plugin keeps the daemon.
	d.state.checkpoint.Close()
	if err := os.Remove(filepath.Join(m.state, "cdi", cdi.SpecFileName("a"))); err != nil {
		t.Fatal(err)
	}
	d = m.start(t)
	if diff := cmp.Diff(want.Env, deviceEdits(t, m.state, "a").Env); diff != "" {
		t.Errorf("environment of the rewritten spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, d.state.checkpoint.MPSDaemons()[key]); diff != "" {
		t.Errorf("daemon after the plugin restarted, want it adopted (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(map[string][]string{key: limited(0, 8192)}, m.daemonEvents(t)); diff != "" {
		t.Errorf("the restart started or stopped a daemon (-want +got):\n%s", diff)
	}
}

// TestAShareIsCappedWhereItsConfigAsks: a share whose GpuConfig asks for a
// compute cap is held to it, by its daemon and in its environment, from
// what the scheduler counted to twice that; the cap outlives a plugin
// restart, and the run is judged against it.
func TestAShareIsCappedWhereItsConfigAsks(t *testing.T) {
	limit := func(percent int) resourceapi.DeviceAllocationConfiguration {
		return opaque(fmt.Sprintf(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimitPercent":%d}}`, percent))
	}
	for _, tc := range []struct {
		name    string
		compute int64
		asked   int
		want    int // the thread percentage of the daemon and the client
	}{
		{"within twice the share", 20, 35, 35},
		{"twice the share at most", 20, 90, 40},
		{"below the share: the share", 40, 10, 40},
		{"the share itself", 40, 40, 40},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMPSDriver(t)
			d := m.start(t)
			// As the scheduler allocates a rewritten claim: through the
			// share subrequest, with the limit's config for it alone.
			claim := computeShare("a", tc.compute, "8Gi")
			claim.Status.Allocation.Devices.Results[0].Request = "gpu/share"
			cfg := limit(tc.asked)
			cfg.Requests = []string{"gpu/share"}
			claim.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig"}`), cfg}
			if r := prepare(t, d, claim)["a"]; r.Err != nil {
				t.Fatal(r.Err)
			}
			key := shareDaemon("a")
			if diff := cmp.Diff(map[string][]string{key: limited(tc.want, 8192)}, m.daemonEvents(t)); diff != "" {
				t.Errorf("daemon limits (-want +got):\n%s", diff)
			}
			thread := mps.EnvActiveThreadPercentage + "=" + strconv.Itoa(tc.want)
			if env := deviceEdits(t, m.state, "a").Env; !slices.Contains(env, thread) {
				t.Errorf("container environment %q lacks %s", env, thread)
			}
			d.state.checkpoint.Close()
			d = m.start(t)
			rec, ok := d.state.checkpoint.Get("a")
			if !ok {
				t.Fatal("the restarted plugin lost claim a")
			}
			dev := rec.Devices[0]
			if got := dev.Sharing.Limits().ComputePercent; got != int32(tc.want) || dev.Sharing.Share.ComputePercent != int32(tc.compute) {
				t.Errorf("after a restart the checkpoint holds %+v, want %d%% counted and a limit of %d%%", *dev.Sharing, tc.compute, tc.want)
			}
		})
	}
}

// TestSharesRunTimeSlicedWithoutMPS: without nvidia-cuda-mps-control the
// share is still prepared, told only its advisory memory limit, and the
// claim's Event says why.
func TestSharesRunTimeSlicedWithoutMPS(t *testing.T) {
	state := t.TempDir()
	d := newTestDriverWith(t, "h100-sxm-8.yaml", state, func(c *Config) { c.MPSDriverRoot = t.TempDir() })
	if r := prepare(t, d, computeShare("a", 45, "8Gi"))["a"]; r.Err != nil {
		t.Fatalf("prepare failed for want of MPS: %v", r.Err)
	}
	if diff := cmp.Diff([]string{"PRISM_GPU_MEMORY_LIMIT=8589934592"}, deviceEdits(t, state, "a").Env); diff != "" {
		t.Errorf("environment of a share without MPS (-want +got):\n%s", diff)
	}
	if ev := waitForEvent(t, d.cfg.KubeClient, "MPSUnavailable"); ev.Type != corev1.EventTypeWarning {
		t.Errorf("MPSUnavailable event of type %s, want Warning", ev.Type)
	}
	if got := d.state.checkpoint.MPSDaemons(); len(got) != 0 {
		t.Errorf("daemons recorded without MPS: %+v", got)
	}
}

// TestATimeSlicedShareIsRefused: a share of part of a GPU whose GpuConfig
// asks for time-slicing is refused at prepare, before anything touches the
// GPU: MPS would not enforce it, and the time slice is the whole GPU's. The
// neighbouring share keeps its MPS daemon and the GPU its time slice. A
// share of the whole GPU has the GPU to itself and is time-sliced as asked.
func TestATimeSlicedShareIsRefused(t *testing.T) {
	timeSliced := opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`)
	exclusive := opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`)
	withConfig := func(c *resourceapi.ResourceClaim, cfg resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
		c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{cfg}
		return c
	}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		// neighbour: an MPS share of the GPU is prepared first.
		neighbour bool
		wantErr   string // "": prepared
		wantSlice gpuv1alpha1.TimeSliceInterval
	}{
		{"compute and memory", withConfig(computeShare("a", 10, "4Gi"), timeSliced), true,
			"prepare claim ns/claim-a: device gpu-0 of request gpu is a share of the GPU (10% compute, 4Gi memory), and its GpuConfig sets sharing.strategy TimeSlicing: " +
				"a share cannot be time-sliced: a time slice is set for the whole GPU, which other claims' shares run on; remove the sharing configuration, or ask for a whole GPU", ""},
		{"memory", withConfig(sharedClaim("a", "4Gi"), timeSliced), true, "is a share of the GPU (4Gi memory)", ""},
		// An H100's 81559Mi hold 79Gi and less than a step besides.
		{"compute, and all the memory", withConfig(computeShare("a", 50, "79Gi"), timeSliced), false, "is a share of the GPU (50% compute, 79Gi memory)", ""},
		{"Exclusive", withConfig(computeShare("a", 10, "4Gi"), exclusive), true, "", ""},
		{"the whole GPU", withConfig(sharedClaim("a", "79Gi"), timeSliced), false, "", gpuv1alpha1.LongTimeSlice},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMPSDriver(t)
			d := m.start(t)
			slices := &RecordedTimeSlices{}
			d.state.timeSlices.slicer = slices
			var before cdispec.ContainerEdits
			if tc.neighbour {
				if r := prepare(t, d, computeShare("n", 45, "8Gi"))["n"]; r.Err != nil {
					t.Fatal(r.Err)
				}
				before = deviceEdits(t, m.state, "n")
			}
			err := prepare(t, d, tc.claim)["a"].Err
			_, recorded := d.state.checkpoint.Get("a")
			_, specErr := os.Stat(filepath.Join(m.state, "cdi", cdi.SpecFileName("a")))
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("prepare: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("prepare error %v, want one containing %q", err, tc.wantErr)
			case tc.wantErr != "" && (recorded || !os.IsNotExist(specErr)):
				t.Errorf("refused share left a record (%v) or a CDI spec (%v)", recorded, specErr)
			}
			g, _ := d.state.gpus.get("gpu-0")
			if got := slices.Get(g.UUID); got != tc.wantSlice {
				t.Errorf("time slice of gpu-0 %q, want %q", got, tc.wantSlice)
			}
			if !tc.neighbour {
				return
			}
			if diff := cmp.Diff(before, deviceEdits(t, m.state, "n")); diff != "" {
				t.Errorf("the neighbour's container edits changed (-before +after):\n%s", diff)
			}
			if _, ok := d.state.checkpoint.MPSDaemons()[shareDaemon("n")]; !ok {
				t.Errorf("the neighbour's MPS daemon is gone")
			}
		})
	}
}

// eventTargets are the objects that Events of the reason are about, as
// "Kind/Name", once there are as many as want or ten seconds have passed.
func eventTargets(t *testing.T, d *Driver, reason string, want int) []string {
	t.Helper()
	var got []string
	_ = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		evs, err := d.cfg.KubeClient.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got = nil
		for _, e := range evs.Items {
			if e.Reason == reason {
				got = append(got, e.InvolvedObject.Kind+"/"+e.InvolvedObject.Name)
			}
		}
		return len(got) >= want, nil
	})
	slices.Sort(got)
	return got
}

// TestMPSDaemonWithoutItsControlPipe: a share's container removed its
// daemon's control pipe (a root container can, whatever the directory's
// mode), so no new client of the share reaches the daemon. The share's
// unprepare, under the driver lock, kills it at once instead of waiting
// out the stop timeout for a quit it cannot send. Another tenant's share
// of the GPU has a daemon of its own, which the breakage does not touch.
func TestMPSDaemonWithoutItsControlPipe(t *testing.T) {
	for _, tc := range []struct {
		name string
		next func(t *testing.T, d *Driver)
		// wantEvents are the daemons' records, wantStarts and wantStops how
		// the plugin started and stopped them.
		wantEvents            map[string][]string
		wantStarts, wantStops map[string]float64
		wantDaemons           int
		// wantGone: the broken daemon is gone at the end.
		wantGone bool
	}{{
		name:       "the share leaves",
		next:       func(t *testing.T, d *Driver) { unprepare(t, d, "a") },
		wantEvents: map[string][]string{shareDaemon("a"): limited(0, 8192)},
		wantStarts: map[string]float64{"started": 1},
		wantStops:  map[string]float64{"unreachable": 1},
		wantGone:   true,
	}, {
		name: "another tenant's share arrives",
		next: func(t *testing.T, d *Driver) {
			if r := prepare(t, d, computeShare("b", 20, "4Gi"))["b"]; r.Err != nil {
				t.Fatal(r.Err)
			}
		},
		wantEvents:  map[string][]string{shareDaemon("a"): limited(0, 8192), shareDaemon("b"): limited(0, 4096)},
		wantStarts:  map[string]float64{"started": 2},
		wantDaemons: 2,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMPSDriver(t)
			d := m.start(t)
			if r := prepare(t, d, computeShare("a", 45, "8Gi"))["a"]; r.Err != nil {
				t.Fatal(r.Err)
			}
			old := d.state.checkpoint.MPSDaemons()[shareDaemon("a")]
			if err := os.Remove(filepath.Join(old.PipeDir, "control")); err != nil {
				t.Fatal(err)
			}
			tc.next(t, d)
			if diff := cmp.Diff(tc.wantStops, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_mps_daemon_stops_total", "result")); diff != "" {
				t.Errorf("how the daemon was stopped (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantStarts, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_mps_daemon_starts_total", "result")); diff != "" {
				t.Errorf("daemon starts (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, m.daemonEvents(t)); diff != "" {
				t.Errorf("daemon records (-want +got):\n%s", diff)
			}
			if got := len(d.state.checkpoint.MPSDaemons()); got != tc.wantDaemons {
				t.Errorf("%d daemons recorded, want %d: %+v", got, tc.wantDaemons, d.state.checkpoint.MPSDaemons())
			}
			// Killed, it is reaped a moment later: until then signal 0
			// still reaches it. Well within the 10 s stop timeout a quit
			// would have been waited for.
			if !tc.wantGone {
				return
			}
			gone := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 2*time.Second, true, func(context.Context) (bool, error) {
				return syscall.Kill(old.PID, 0) != nil, nil
			})
			if gone != nil {
				t.Errorf("the daemon %d without a control pipe still runs", old.PID)
			}
		})
	}
}
