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
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/clock"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

const testNode = "node-a"

// newTestDriver runs a driver on a simulated fleet without a kubelet.
func newTestDriver(t testing.TB, fleetFile, stateDir string) *Driver {
	t.Helper()
	return newTestDriverWith(t, fleetFile, stateDir, nil)
}

// simulatedNVML is a simulated NVML of a fleet under demo/fleets on
// testNode; usageFile, where set, is the file its GPUs' use is read from.
func simulatedNVML(t testing.TB, fleetFile, usageFile string) *nvml.Simulated {
	t.Helper()
	fleet, err := nvml.LoadFleet(filepath.Join("..", "..", "demo", "fleets", fleetFile))
	if err != nil {
		t.Fatal(err)
	}
	if usageFile != "" {
		fleet.UsageFile = usageFile
	}
	sim, err := nvml.NewSimulated(fleet, testNode)
	if err != nil {
		t.Fatal(err)
	}
	return sim
}

// newTestDriverWith is newTestDriver with a chance to change the Config,
// for example its client or inventory, before the driver starts.
func newTestDriverWith(t testing.TB, fleetFile, stateDir string, configure func(*Config)) *Driver {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	cfg := testConfig(t, fleetFile, stateDir)
	if configure != nil {
		configure(&cfg)
	}
	d, err := newDriver(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d.pool.publisher = &recordingPublisher{}
	t.Cleanup(d.broadcast.Shutdown)
	return d
}

// useRecorder makes d and the parts it holds record their Events with r.
func useRecorder(d *Driver, r record.EventRecorder) {
	d.recorder, d.pool.recorder, d.state.shares.recorder, d.state.profiler.recorder, d.health.recorder = r, r, r, r, r
}

// useClock makes d and the parts it holds tell time by c.
func useClock(d *Driver, c clock.WithTicker) {
	d.clock, d.state.guard.mu.clock, d.health.clock = c, c, c
}

// testConfig is a driver's Config for a simulated fleet, without a kubelet.
func testConfig(t testing.TB, fleetFile, stateDir string) Config {
	t.Helper()
	inventory := nvml.NewFleetInventory(filepath.Join("..", "..", "demo", "fleets", fleetFile), testNode)
	root := filepath.Join(stateDir, "driver-root")
	minors := []int{0, 1, 2, 3, 4, 5, 6, 7}
	if err := cdi.MakeFakeDriverRoot(root, minors); err != nil {
		t.Fatal(err)
	}
	writer, err := cdi.NewWriter(cdi.Options{Root: filepath.Join(stateDir, "cdi"), Source: cdi.NewSimulatedSource(cdi.Roots{DriverRoot: root})})
	if err != nil {
		t.Fatal(err)
	}
	return Config{NodeName: testNode, KubeClient: fake.NewClientset(), Inventory: inventory, CDI: writer, StateDir: stateDir}
}

// recordingPublisher stands in for the helper's ResourceSlice controller.
type recordingPublisher struct {
	mu         sync.Mutex
	last       []resourceapi.Device
	lastSlices []resourceslice.Slice
	publishes  int
}

func (p *recordingPublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.last = r.Pools[testNode].Slices[0].Devices
	p.lastSlices = r.Pools[testNode].Slices
	p.publishes++
	return nil
}

// slices is the whole pool last published.
func (p *recordingPublisher) slices() []resourceslice.Slice {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.lastSlices
}

func (p *recordingPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.publishes
}

func (p *recordingPublisher) devices() []resourceapi.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// waitForEvent waits until an event with this reason was recorded.
func waitForEvent(t testing.TB, client kubernetes.Interface, reason string) corev1.Event {
	t.Helper()
	var found corev1.Event
	err := wait.PollUntilContextCancel(t.Context(), 10*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		evs, err := client.CoreV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == reason {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no %s event: %v", reason, err)
	}
	return found
}

// allocatedClaim is a claim allocated the named devices of testNode.
func allocatedClaim(uid string, devices []string, configs ...resourceapi.DeviceAllocationConfiguration) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "claim-" + uid, Namespace: "ns", UID: types.UID(uid)}}
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
			Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: testNode, Device: d,
		})
	}
	c.Status.Allocation.Devices.Config = configs
	return c
}

func opaque(json string) resourceapi.DeviceAllocationConfiguration {
	return resourceapi.DeviceAllocationConfiguration{
		Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: gpuv1alpha1.DriverName, Parameters: runtime.RawExtension{Raw: []byte(json)},
		}},
	}
}

func prepare(t testing.TB, d *Driver, claims ...*resourceapi.ResourceClaim) map[types.UID]kubeletplugin.PrepareResult {
	t.Helper()
	res, err := d.PrepareResourceClaims(context.Background(), claims)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func TestPrepareIsIdempotent(t *testing.T) {
	d := newTestDriver(t, "h100-sxm-8.yaml", t.TempDir())
	claim := allocatedClaim("uid-1", []string{"gpu-0", "gpu-1"})
	first := prepare(t, d, claim)["uid-1"]
	second := prepare(t, d, claim)["uid-1"]
	if first.Err != nil || second.Err != nil {
		t.Fatalf("prepare errors: %v, %v", first.Err, second.Err)
	}
	if fmt.Sprint(first.Devices) != fmt.Sprint(second.Devices) {
		t.Errorf("second prepare returned %v, first %v", second.Devices, first.Devices)
	}
	want := []string{"k8s.gpu.prism.dev/claim=uid-1-gpu-0"}
	if got := first.Devices[0].CDIDeviceIDs; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("CDI IDs %v, want %v", got, want)
	}
}

func TestUnprepareUnknownClaimSucceeds(t *testing.T) {
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "never-seen"}})
	if err != nil || res["never-seen"] != nil {
		t.Fatalf("unprepare of an unknown claim: %v %v", err, res["never-seen"])
	}
}

func TestPrepareRefusesADeviceHeldByAnotherClaim(t *testing.T) {
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	if r := prepare(t, d, allocatedClaim("holder", []string{"gpu-1"}))["holder"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	r := prepare(t, d, allocatedClaim("intruder", []string{"gpu-1"}))["intruder"]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "ns/claim-holder") {
		t.Fatalf("want an error naming the holding claim, got %v", r.Err)
	}
	// Once released, the device can be prepared again.
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "holder"}}); err != nil {
		t.Fatal(err)
	}
	if r := prepare(t, d, allocatedClaim("intruder", []string{"gpu-1"}))["intruder"]; r.Err != nil {
		t.Fatalf("after release: %v", r.Err)
	}
}

func TestBadConfigFailsOnlyItsClaim(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"unknown field", `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"stratgy":"TimeSlicing"}}`, "unknown field"},
		{"bad value", `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Sometimes"}}`, "sharing.strategy"},
		{"wrong kind", `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"CpuConfig"}`, "unsupported kind"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, "t4-2.yaml", t.TempDir())
			res := prepare(t, d, allocatedClaim("bad", []string{"gpu-0"}, opaque(tc.config)), allocatedClaim("good", []string{"gpu-1"}))
			if err := res["bad"].Err; err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("bad claim: want error containing %q, got %v", tc.want, err)
			}
			if err := res["good"].Err; err != nil {
				t.Errorf("good claim in the same call failed: %v", err)
			}
			if _, ok := d.state.checkpoint.Get("bad"); ok {
				t.Error("a rejected claim was recorded in the checkpoint")
			}
		})
	}
}

func TestValidConfigIsAccepted(t *testing.T) {
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	cfg := `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`
	if r := prepare(t, d, allocatedClaim("ts", []string{"gpu-0"}, opaque(cfg)))["ts"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	rec, _ := d.state.checkpoint.Get("ts")
	if rec.Devices[0].Sharing == nil || rec.Devices[0].Sharing.Strategy != "TimeSlicing" {
		t.Errorf("sharing not recorded: %+v", rec.Devices[0].Sharing)
	}
}

func TestRestartRollsBackInterruptedPrepareAndRemovesOrphans(t *testing.T) {
	dir := t.TempDir()
	d := newTestDriver(t, "t4-2.yaml", dir)
	prepare(t, d, allocatedClaim("done", []string{"gpu-0"}))
	// A prepare interrupted after its first phase, and a spec nobody owns.
	planned, err := d.state.plan(context.Background(), allocatedClaim("half", []string{"gpu-1"}))
	if err != nil {
		t.Fatal(err)
	}
	planned.State = checkpoint.PrepareStarted
	if err := d.state.checkpoint.Update(context.Background(), func(data *checkpoint.Data) error {
		data.Claims["half"] = planned
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.cfg.CDI.WriteClaimSpec(context.Background(), cdi.Claim{UID: "orphan", Devices: []cdi.Device{{Name: "gpu-1", UUID: "GPU-x", Minor: 1}}}); err != nil {
		t.Fatal(err)
	}

	restarted := newTestDriver(t, "t4-2.yaml", dir)
	if _, ok := restarted.state.checkpoint.Get("half"); ok {
		t.Error("interrupted prepare was not rolled back")
	}
	specs, err := restarted.cfg.CDI.ListClaimSpecs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(specs) != "[done]" {
		t.Errorf("specs after restart %v, want only the completed claim's", specs)
	}
	// The rolled-back claim's device is free again.
	if r := prepare(t, restarted, allocatedClaim("half", []string{"gpu-1"}))["half"]; r.Err != nil {
		t.Errorf("retrying the interrupted prepare: %v", r.Err)
	}
}

// TestConcurrentPrepareUnprepare runs 1000 calls at once over 8 devices. Each
// worker owns one device, so every call must succeed; the race detector
// checks the locking.
func TestConcurrentPrepareUnprepare(t *testing.T) {
	d := newTestDriver(t, "h100-sxm-8.yaml", t.TempDir())
	const calls = 1000
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls / 8 / 2 {
				uid := fmt.Sprintf("w%d-%d", w, i)
				claim := allocatedClaim(uid, []string{fmt.Sprintf("gpu-%d", w)})
				var inner sync.WaitGroup
				// Two replays of the same prepare race each other.
				for range 2 {
					inner.Add(1)
					go func() {
						defer inner.Done()
						res, err := d.PrepareResourceClaims(context.Background(), []*resourceapi.ResourceClaim{claim})
						if err == nil {
							err = res[types.UID(uid)].Err
						}
						if err != nil {
							errs <- err
						}
					}()
				}
				inner.Wait()
				res, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}})
				if err == nil {
					err = res[types.UID(uid)]
				}
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if left := d.state.checkpoint.List(); len(left) != 0 {
		t.Errorf("%d claims left prepared", len(left))
	}
}

// sharedClaim is a claim allocated a share of gpu-0's memory.
func sharedClaim(uid, memory string) *resourceapi.ResourceClaim {
	c := allocatedClaim(uid, []string{"gpu-0"})
	share := types.UID("share-" + uid)
	c.Status.Allocation.Devices.Results[0].ShareID = &share
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse(memory)}
	return c
}

func TestSharedDeviceGuard(t *testing.T) {
	for _, tc := range []struct {
		name    string
		claims  []*resourceapi.ResourceClaim
		wantErr string // for the last claim; the others must succeed
	}{
		// An H100 has 81559Mi, as NVML reports on a real one: 79Gi of
		// whole-GiB shares fit it, 80Gi do not.
		{"shares that fit", []*resourceapi.ResourceClaim{sharedClaim("a", "20Gi"), sharedClaim("b", "20Gi"), sharedClaim("c", "39Gi")}, ""},
		{"shares of the marketing size", []*resourceapi.ResourceClaim{sharedClaim("a", "40Gi"), sharedClaim("b", "40Gi")}, "would add up to"},
		{"shares past the GPU's memory", []*resourceapi.ResourceClaim{sharedClaim("a", "60Gi"), sharedClaim("b", "30Gi")}, "would add up to"},
		{"whole claim after a share", []*resourceapi.ResourceClaim{sharedClaim("a", "20Gi"), allocatedClaim("b", []string{"gpu-0"})}, "refusing to share"},
		{"share after a whole claim", []*resourceapi.ResourceClaim{allocatedClaim("a", []string{"gpu-0"}), sharedClaim("b", "20Gi")}, "refusing to share"},
		{"two whole claims of one GPU", []*resourceapi.ResourceClaim{allocatedClaim("a", []string{"gpu-0"}), allocatedClaim("b", []string{"gpu-0"})}, "refusing to share"},
	} {
		// Claims of one kubelet call are guarded against each other as
		// claims of separate calls are.
		for _, oneCall := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/one call %v", tc.name, oneCall), func(t *testing.T) {
				d := newTestDriver(t, "h100-sxm-8.yaml", t.TempDir())
				results := map[types.UID]kubeletplugin.PrepareResult{}
				if oneCall {
					results = prepare(t, d, tc.claims...)
				} else {
					for _, c := range tc.claims {
						results[c.UID] = prepare(t, d, c)[c.UID]
					}
				}
				for i, c := range tc.claims {
					err := results[c.UID].Err
					last := i == len(tc.claims)-1
					_, recorded := d.state.checkpoint.Get(string(c.UID))
					switch {
					case last && tc.wantErr != "":
						if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
							t.Errorf("claim %s: want error containing %q, got %v", c.UID, tc.wantErr, err)
						}
						if recorded {
							t.Errorf("refused claim %s is in the checkpoint", c.UID)
						}
					case err != nil:
						t.Errorf("claim %s: %v", c.UID, err)
					case !recorded:
						t.Errorf("claim %s is not in the checkpoint", c.UID)
					}
				}
			})
		}
	}
}

func TestShareIsToldToTheWorkload(t *testing.T) {
	d := newTestDriver(t, "h100-sxm-8.yaml", t.TempDir())
	res := prepare(t, d, sharedClaim("a", "20Gi"))["a"]
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.Devices[0].ShareID == nil || *res.Devices[0].ShareID != "share-a" {
		t.Errorf("kubelet device lacks the share ID: %+v", res.Devices[0])
	}
	rec, _ := d.state.checkpoint.Get("a")
	if got := rec.Devices[0].Sharing.Share.MemoryBytes; got != 20<<30 {
		t.Errorf("recorded share %d bytes, want 20Gi", got)
	}
}

// TestProfilingNotPermittedIsExplained: when the driver restricts the
// counters and the pod cannot read them, the claim says so before the run.
func TestProfilingNotPermittedIsExplained(t *testing.T) {
	for _, tc := range []struct {
		name       string
		privileged bool
		wantEvent  bool
	}{
		{"pod without SYS_ADMIN", false, true},
		{"privileged pod", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			d := newTestDriver(t, "t4-2.yaml", dir)
			d.state.profiler.cfg = &ProfilingConfig{
				Options:  fakeProfilingHost(t, dir),
				ProcRoot: filepath.Join("profiling", "testdata", "proc", "restricted-nocap"),
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: "ns"},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "cuda", SecurityContext: &corev1.SecurityContext{Privileged: &tc.privileged}}}}}
			client := d.cfg.KubeClient
			if _, err := client.CoreV1().Pods("ns").Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			claim := allocatedClaim("p1", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`))
			claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "trainer", UID: "pod-uid"}}
			if r := prepare(t, d, claim)["p1"]; r.Err != nil {
				t.Fatal(r.Err)
			}
			// The recorder sends Events on its own goroutine: an Event that
			// must come is waited for as long as a loaded machine needs, one
			// that must not is looked for for a second.
			patience := time.Second
			if tc.wantEvent {
				patience = 30 * time.Second
			}
			found := false
			for deadline := time.Now().Add(patience); !found && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				evs, _ := client.CoreV1().Events("ns").List(context.Background(), metav1.ListOptions{})
				for _, e := range evs.Items {
					found = found || e.Reason == "ProfilingNotPermitted"
				}
			}
			if found != tc.wantEvent {
				t.Errorf("ProfilingNotPermitted event recorded = %v, want %v", found, tc.wantEvent)
			}
		})
	}
}

// TestRollingUpdateInstancesShareTheCheckpoint: during a DaemonSet rolling
// update the old and the new instance prepare claims on the same node, one
// call at a time (the helper's file lock). Each must see the other's claims,
// or both could hand out the same GPU.
func TestRollingUpdateInstancesShareTheCheckpoint(t *testing.T) {
	dir := t.TempDir()
	old, updated := rollingUpdateInstances(t, dir)

	if r := prepare(t, old, allocatedClaim("a", []string{"gpu-0"}))["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	r := prepare(t, updated, allocatedClaim("b", []string{"gpu-0"}))["b"]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "claim-a") {
		t.Fatalf("the new instance handed out gpu-0 that the old one prepared: %v", r.Err)
	}
	if r := prepare(t, updated, allocatedClaim("c", []string{"gpu-1"}))["c"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	// The old instance's next write must keep the new instance's claim.
	if _, err := old.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "a"}}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"c"}, checkpointedClaims(t, dir)); diff != "" {
		t.Errorf("claims recorded after the old instance unprepared a (-want +got):\n%s", diff)
	}
}

// rollingUpdateInstances is the old and the new plugin instance of a
// rolling update, sharing dir's checkpoint.
func rollingUpdateInstances(t *testing.T, dir string) (old, updated *Driver) {
	t.Helper()
	old = newTestDriver(t, "t4-2.yaml", dir)
	updated = newTestDriver(t, "t4-2.yaml", dir)
	old.state.guard.rollingUpdate, updated.state.guard.rollingUpdate = true, true
	return old, updated
}

// checkpointedClaims is the UIDs of the claims a plugin starting on dir
// finds in its checkpoint, sorted.
func checkpointedClaims(t *testing.T, dir string) []string {
	t.Helper()
	var uids []string
	for _, c := range newTestDriver(t, "t4-2.yaml", dir).state.checkpoint.List() {
		uids = append(uids, c.UID)
	}
	return uids
}

func TestNvidiaSMISetsTheTimeSlice(t *testing.T) {
	dir := t.TempDir()
	record := filepath.Join(dir, "args")
	smi := filepath.Join(dir, "nvidia-smi")
	if err := os.WriteFile(smi, []byte("#!/bin/sh\necho \"$@\" > "+record+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := (NvidiaSMI{Path: smi}).SetTimeSlice(context.Background(), "GPU-1234", "Long"); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(record)
	if err != nil {
		t.Fatal(err)
	}
	if want := "compute-policy -i GPU-1234 --set-timeslice=3\n"; string(got) != want {
		t.Errorf("nvidia-smi called with %q, want %q", got, want)
	}
	if err := (NvidiaSMI{Path: filepath.Join(dir, "missing")}).SetTimeSlice(context.Background(), "GPU-1234", "Long"); err == nil {
		t.Error("a missing nvidia-smi did not fail the call")
	}
}

func TestTimeSlicingIsAppliedAndReset(t *testing.T) {
	d := newTestDriver(t, "t4-2.yaml", t.TempDir())
	slices := &RecordedTimeSlices{}
	d.state.timeSlices.slicer = slices
	cfg := `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`
	if r := prepare(t, d, allocatedClaim("ts", []string{"gpu-1"}, opaque(cfg)))["ts"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	g, _ := d.state.gpus.get("gpu-1")
	if got := slices.Get(g.UUID); got != "Long" {
		t.Errorf("time slice after prepare = %q, want Long", got)
	}
	if _, err := d.UnprepareResourceClaims(context.Background(), []kubeletplugin.NamespacedObject{{UID: "ts"}}); err != nil {
		t.Fatal(err)
	}
	if got := slices.Get(g.UUID); got != "Default" {
		t.Errorf("time slice after unprepare = %q, want Default", got)
	}
}
