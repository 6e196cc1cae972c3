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
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// shareContainer plays a container of a prepared claim's share, as the
// container runtime would start it from the claim's CDI spec: its
// environment, with the mounts of the pipe directory and /dev/shm standing
// for what the container sees there.
type shareContainer struct {
	env []string
	// pipeDir and shmDir are the host directories mounted at the
	// container's /tmp/nvidia-mps and /dev/shm.
	pipeDir, shmDir string
}

func containerOf(t *testing.T, m *mpsDriver, uid string) shareContainer {
	t.Helper()
	edits := deviceEdits(t, m.state, uid)
	c := shareContainer{env: slices.Clone(edits.Env)}
	for _, mnt := range edits.Mounts {
		switch mnt.ContainerPath {
		case mps.ContainerPipeDir:
			c.pipeDir = mnt.HostPath
		case "/dev/shm":
			c.shmDir = mnt.HostPath
		}
	}
	if c.shmDir == "" {
		// The container's own /dev/shm, which no daemon sees.
		c.shmDir = t.TempDir()
	}
	return c
}

// client runs the stand-in CUDA program in the container: with its
// environment (changed by edit), as the user cred.
func (c shareContainer) client(t *testing.T, m *mpsDriver, edit func([]string) []string, cred *syscall.Credential, args ...string) *mpstest.Client {
	t.Helper()
	env := slices.Clone(c.env)
	if edit != nil {
		env = edit(env)
	}
	env = slices.DeleteFunc(env, func(kv string) bool { return strings.HasPrefix(kv, mps.EnvPipeDirectory+"=") })
	// The documented rule, stricter than the H200's driver: the share's
	// containers must reach its server through the share's /dev/shm.
	env = append(env, mps.EnvPipeDirectory+"="+c.pipeDir, "FAKE_MPS_SHM=shared", "FAKE_MPS_SHM_DIR="+c.shmDir, "FAKE_MPS_CONTROL_RECORD="+m.record)
	return mpstest.StartClient(t, filepath.Join(m.driverRoot, "usr", "bin", mps.ControlBinary), env, cred, args...)
}

// openToAll lets every user reach path, as the state directory and driver
// root of a node are, though the test's temporary directories are 0700.
func openToAll(t *testing.T, paths ...string) {
	t.Helper()
	for _, p := range paths {
		for dir := p; strings.HasPrefix(dir, os.TempDir()+"/"); dir = filepath.Dir(dir) {
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestAShareHoldsWhateverItsWorkloadDoes: two tenants' shares of one GPU,
// each run by the stand-in MPS, which holds a client to what the daemon
// says and lets its environment only lower it, serves one UID at a time,
// and needs the server's /dev/shm. A share's workload cannot drop or raise
// its limits, reach the other tenant's daemon, or make it wait.
func TestAShareHoldsWhateverItsWorkloadDoes(t *testing.T) {
	const gi = int64(1) << 30
	const (
		thread = mps.EnvActiveThreadPercentage
		pinned = mps.EnvPinnedDeviceMemLimit
	)
	limitsOfA := mpstest.ClientResult{MPS: true, ActiveThreadPercentage: 40, PinnedMemLimitBytes: 8 * gi}
	uncapped := mpstest.ClientResult{MPS: true, ActiveThreadPercentage: 100, PinnedMemLimitBytes: 8 * gi}
	for _, tc := range []struct {
		name string
		// a is a's claim: its share is capped at 40 % unless it says
		// otherwise.
		a *resourceapi.ResourceClaim
		// env changes a's container's environment.
		env  func([]string) []string
		want mpstest.ClientResult
	}{
		{"as prepared", nil, nil, limitsOfA},
		{"limits unset", nil, mpstest.UnsetEnv(thread, pinned), limitsOfA},
		{"limits raised", nil, mpstest.SetEnv(thread+"=100", pinned+"=0=81920M"), limitsOfA},
		{"limits lowered", nil, mpstest.SetEnv(thread+"=10", pinned+"=0=1024M"), mpstest.ClientResult{MPS: true, ActiveThreadPercentage: 10, PinnedMemLimitBytes: gi}},
		{"no cap asked: every SM, its memory", computeShare("a", 40, "8Gi"), nil, uncapped},
		{"no cap asked, memory raised", computeShare("a", 40, "8Gi"), mpstest.SetEnv(pinned + "=0=81920M"), uncapped},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newMPSDriver(t)
			d := m.start(t)
			a := tc.a
			if a == nil {
				a = cappedShare("a", 40, 40, "8Gi")
			}
			for _, c := range []*resourceapi.ResourceClaim{a, computeShare("b", 20, "4Gi")} {
				if r := prepare(t, d, c)[c.UID]; r.Err != nil {
					t.Fatal(r.Err)
				}
			}
			got := containerOf(t, m, "a").client(t, m, tc.env, nil).Release(t)
			if diff := cmp.Diff(tc.want, got, cmpopts.IgnoreFields(mpstest.ClientResult{}, "ServerUID", "Server")); diff != "" {
				t.Errorf("what a's workload got (-want +got):\n%s", diff)
			}
		})
	}
}

// TestTenantsOfOneGPUKeepApart: tenants of one GPU run as different users
// and do not wait for each other, and what one tenant does to its daemon
// does not reach the other's.
func TestTenantsOfOneGPUKeepApart(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("playing tenants of other users needs root")
	}
	m := newMPSDriver(t)
	d := m.start(t)
	for _, c := range []*resourceapi.ResourceClaim{computeShare("a", 40, "8Gi"), computeShare("b", 20, "4Gi")} {
		if r := prepare(t, d, c)[c.UID]; r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	openToAll(t, m.state, m.driverRoot)
	a, b := containerOf(t, m, "a"), containerOf(t, m, "b")
	if strings.HasPrefix(b.pipeDir, filepath.Dir(a.pipeDir)) || a.shmDir == b.shmDir {
		t.Fatalf("the tenants share directories: a %+v, b %+v", a, b)
	}

	// a's workload runs as one user, and stays; b's, as another, starts
	// at once beside it, in a server of its own with its own limits.
	held := a.client(t, m, nil, &syscall.Credential{Uid: 1000, Gid: 1000}, "--hold=30s")
	if r := held.Result(t); !r.MPS || r.Error != "" {
		t.Fatalf("a's workload: %+v", r)
	}
	got := b.client(t, m, nil, &syscall.Credential{Uid: 2000, Gid: 2000}, "--wait=2s").Release(t)
	want := mpstest.ClientResult{MPS: true, ActiveThreadPercentage: 100, PinnedMemLimitBytes: 4 << 30}
	if diff := cmp.Diff(want, got, cmpopts.IgnoreFields(mpstest.ClientResult{}, "ServerUID", "Server")); diff != "" {
		t.Errorf("b's workload beside a's, as another user (-want +got):\n%s", diff)
	}
	held.Release(t)

	// a's workload tells what it reaches to quit: its own daemon.
	quit := exec.Command(filepath.Join(m.driverRoot, "usr", "bin", mps.ControlBinary))
	quit.Env = []string{mps.EnvPipeDirectory + "=" + a.pipeDir, "FAKE_MPS_CONTROL_RECORD=" + m.record}
	quit.Stdin = strings.NewReader("quit\n")
	quit.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 1000, Gid: 1000}}
	if out, err := quit.CombinedOutput(); err != nil {
		t.Fatalf("a's quit: %v %s", err, out)
	}
	if r := b.client(t, m, nil, nil).Release(t); !r.MPS || r.Error != "" || r.PinnedMemLimitBytes != 4<<30 {
		t.Errorf("b's workload after a's quit: %+v, want its own daemon still serving it", r)
	}
}

// TestADeadShareDaemonIsReplacedAndItsPodsTold: a share's daemon that dies
// while its share is prepared is replaced by the next check, with the
// share's limits, and the node, the claim and the pod that reserves it
// hear that the pod's containers lost their MPS server. A daemon that
// serves is left alone.
func TestADeadShareDaemonIsReplacedAndItsPodsTold(t *testing.T) {
	m := newMPSDriver(t)
	d := m.start(t)
	claim := computeShare("a", 40, "8Gi")
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-a", UID: "pod-a-uid"}}
	if _, err := d.cfg.KubeClient.ResourceV1().ResourceClaims(claim.Namespace).Create(t.Context(), claim, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := prepare(t, d, claim)["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	key := shareDaemon("a")
	d.state.shares.repair(t.Context())
	old := d.state.checkpoint.MPSDaemons()[key]
	if diff := cmp.Diff(map[string][]string{key: limited(0, 8192)}, m.daemonEvents(t)); diff != "" {
		t.Fatalf("a check of a serving daemon started or stopped one (-want +got):\n%s", diff)
	}

	if err := syscall.Kill(-old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return syscall.Kill(old.PID, 0) != nil, nil
	}); err != nil {
		t.Fatalf("the killed daemon %d still runs", old.PID)
	}
	d.state.shares.repair(t.Context())
	fresh := d.state.checkpoint.MPSDaemons()[key]
	if fresh.PID == 0 || fresh.PID == old.PID || syscall.Kill(fresh.PID, 0) != nil {
		t.Errorf("daemon after the check: %+v, want a fresh one running in place of %d", fresh, old.PID)
	}
	if diff := cmp.Diff(map[string][]string{key: slices.Concat(limited(0, 8192), limited(0, 8192))}, m.daemonEvents(t)); diff != "" {
		t.Errorf("daemons after the check (-want +got):\n%s", diff)
	}
	want := []string{"Node/" + testNode, "Pod/pod-a", "ResourceClaim/claim-a"}
	if diff := cmp.Diff(want, eventTargets(t, d, "MPSDaemonReplaced", len(want))); diff != "" {
		t.Errorf("MPSDaemonReplaced Events (-want +got):\n%s", diff)
	}
}

// TestARestartedPluginTellsWhoseDaemonItReplaced: after a plugin container
// restart every share's daemon is gone with it; the next plugin starts
// fresh ones with the shares' limits, and the node, the claims and their
// pods hear that the pods' containers lost their MPS server.
func TestARestartedPluginTellsWhoseDaemonItReplaced(t *testing.T) {
	m := newMPSDriver(t)
	claim := computeShare("a", 40, "8Gi")
	claim.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-a", UID: "pod-a-uid"}}
	d := m.start(t)
	if r := prepare(t, d, claim)["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	old := d.state.checkpoint.MPSDaemons()[shareDaemon("a")]
	d.state.checkpoint.Close()
	// The container's processes go with it: the daemon too.
	if err := syscall.Kill(-old.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 5*time.Second, true, func(context.Context) (bool, error) {
		return syscall.Kill(old.PID, 0) != nil, nil
	}); err != nil {
		t.Fatalf("the killed daemon %d still runs", old.PID)
	}

	d = newTestDriverWith(t, "h100-sxm-8.yaml", m.state, func(c *Config) {
		c.MPSDriverRoot = m.driverRoot
		c.KubeClient = fake.NewClientset(claim)
	})
	t.Cleanup(d.state.checkpoint.Close)
	if fresh := d.state.checkpoint.MPSDaemons()[shareDaemon("a")]; fresh.PID == 0 || fresh.PID == old.PID || fresh.Limits != old.Limits {
		t.Errorf("daemon after the restart: %+v, want a fresh one with the limits of %+v", fresh, old)
	}
	want := []string{"Node/" + testNode, "Pod/pod-a", "ResourceClaim/claim-a"}
	if diff := cmp.Diff(want, eventTargets(t, d, "MPSDaemonReplaced", len(want))); diff != "" {
		t.Errorf("MPSDaemonReplaced Events (-want +got):\n%s", diff)
	}
}
