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
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/cdi"
	"github.com/prismgpu/prism/pkg/mps/mpstest"
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
	t.Cleanup(d.checkpoint.Close)
	return d
}

// daemonEvents are what the stand-in's daemons recorded, as "event command".
func (m *mpsDriver) daemonEvents(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, e := range mpstest.Read(t, m.record) {
		if e.Role == "daemon" {
			out = append(out, e.Event+" "+e.Command)
		}
	}
	return out
}

// computeShare is a claim allocated a share of gpu-0: per cent of its SMs
// and an amount of memory.
func computeShare(uid string, percent int64, memory string) *resourceapi.ResourceClaim {
	c := sharedClaim(uid, memory)
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity[gpuv1alpha1.ComputeCapacity.Qualified()] = *resource.NewQuantity(percent, resource.DecimalSI)
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

// TestMPSDaemonLivesAsLongAsTheGPUsShares: the first share of a GPU starts
// its daemon, the second uses it, and the daemon stops with the last.
func TestMPSDaemonLivesAsLongAsTheGPUsShares(t *testing.T) {
	m := newMPSDriver(t)
	d := m.start(t)
	for _, uid := range []string{"a", "b"} {
		if r := prepare(t, d, computeShare(uid, 45, "8Gi"))[types.UID(uid)]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	g, _ := d.device("gpu-0")
	daemons := d.checkpoint.MPSDaemons()
	if len(daemons) != 1 || daemons[g.UUID].PID == 0 {
		t.Fatalf("daemons after two shares of gpu-0: %+v, want one for %s", daemons, g.UUID)
	}
	unprepare(t, d, "a")
	if diff := cmp.Diff([]string{"start "}, m.daemonEvents(t)); diff != "" {
		t.Errorf("daemon after the first of two shares left (-want +got):\n%s", diff)
	}
	unprepare(t, d, "b")
	if diff := cmp.Diff([]string{"start ", "command quit", "exit "}, m.daemonEvents(t)); diff != "" {
		t.Errorf("daemon after the last share left (-want +got):\n%s", diff)
	}
	if got := d.checkpoint.MPSDaemons(); len(got) != 0 {
		t.Errorf("daemons recorded after the last share: %+v", got)
	}
	if _, err := os.Stat(filepath.Join(m.state, "mps", g.UUID)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directories remain: %v", err)
	}
}

// TestMPSShareEnvironment: a hand-worked share, 45 % of the SMs and 8 GiB,
// reaches the container as MPS's own variables, and a restarted plugin
// adopts the daemon and writes a lost spec again identically.
func TestMPSShareEnvironment(t *testing.T) {
	m := newMPSDriver(t)
	d := m.start(t)
	if r := prepare(t, d, computeShare("a", 45, "8Gi"))["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	g, _ := d.device("gpu-0")
	want := cdispec.ContainerEdits{
		Env: []string{
			"PRISM_GPU_MEMORY_LIMIT=8589934592",
			"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps",
			"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=45",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M",
		},
		Mounts: []*cdispec.Mount{{
			HostPath: filepath.Join(m.state, "mps", g.UUID, "pipe"), ContainerPath: "/tmp/nvidia-mps", Type: "bind",
			Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"},
		}},
	}
	got := deviceEdits(t, m.state, "a")
	// The device node and anything else the simulated source adds are not
	// this test's business.
	got.DeviceNodes, got.Hooks = nil, nil
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("container edits of the share (-want +got):\n%s", diff)
	}
	before := d.checkpoint.MPSDaemons()[g.UUID]

	// A crash loses the spec; the restarted plugin keeps the daemon.
	d.checkpoint.Close()
	if err := os.Remove(filepath.Join(m.state, "cdi", cdi.SpecFileName("a"))); err != nil {
		t.Fatal(err)
	}
	d = m.start(t)
	if diff := cmp.Diff(want.Env, deviceEdits(t, m.state, "a").Env); diff != "" {
		t.Errorf("environment of the rewritten spec (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(before, d.checkpoint.MPSDaemons()[g.UUID]); diff != "" {
		t.Errorf("daemon after the plugin restarted, want it adopted (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"start "}, m.daemonEvents(t)); diff != "" {
		t.Errorf("the restart started or stopped a daemon (-want +got):\n%s", diff)
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
	if got := d.checkpoint.MPSDaemons(); len(got) != 0 {
		t.Errorf("daemons recorded without MPS: %+v", got)
	}
}
