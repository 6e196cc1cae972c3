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

package main

import (
	"errors"
	"fmt"
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

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// bin is the stand-in, built once, where every user may run it.
var bin string

func TestMain(m *testing.M) {
	os.Exit(func() int {
		dir, err := os.MkdirTemp("", "fake-mps-control-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		bin = filepath.Join(dir, "nvidia-cuda-mps-control")
		if err := errors.Join(os.Chmod(dir, 0o755), mpstest.Build(bin)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}())
}

// nobody is a user other than the test's, for the clients of another UID.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534}

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running a client as another UID needs root")
	}
}

// node is one node's MPS: a pipe directory, a /dev/shm and a record, and
// the daemon once started.
type node struct {
	pipeDir, shmDir, record string
	env                     []string
	daemon                  *exec.Cmd
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{pipeDir: filepath.Join(mpstest.OpenTempDir(t), "pipe"), shmDir: mpstest.OpenTempDir(t), record: mpstest.NewRecord(t)}
	// Every user's, sticky, as /dev/shm is.
	if err := os.Chmod(n.shmDir, 0o1777); err != nil {
		t.Fatal(err)
	}
	n.env = []string{
		"PATH=" + os.Getenv("PATH"),
		"CUDA_MPS_PIPE_DIRECTORY=" + n.pipeDir,
		"CUDA_MPS_LOG_DIRECTORY=" + mpstest.OpenTempDir(t),
		"FAKE_MPS_SHM_DIR=" + n.shmDir,
		"FAKE_MPS_CONTROL_RECORD=" + n.record,
	}
	return n
}

// start runs the daemon in the foreground, under shell (as "exec bin
// -f"), and waits until it listens. It is killed when the test ends.
func (n *node) start(t *testing.T, shell string) {
	t.Helper()
	n.daemon = exec.Command("/bin/sh", "-c", shell+"exec "+bin+" -f")
	n.daemon.Env = n.env
	n.daemon.Stderr = os.Stderr
	// In a group of its own, as the plugin starts it.
	n.daemon.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := n.daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = n.daemon.Process.Signal(syscall.SIGTERM)
		_ = n.daemon.Wait()
	})
	n.waitFor(t, "the daemon to listen", func() bool {
		_, err := os.Stat(filepath.Join(n.pipeDir, "control"))
		return err == nil
	})
}

// control runs the control client as cred (nil: the test's user) with
// script on its standard input, and returns what it printed and its exit
// status.
func (n *node) control(t *testing.T, cred *syscall.Credential, script string) (stdout, stderr string, status int) {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.Env = n.env
	cmd.Stdin = strings.NewReader(script)
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
}

// mustControl runs the control client and fails the test if it fails.
func (n *node) mustControl(t *testing.T, script string) string {
	t.Helper()
	out, errOut, status := n.control(t, nil, script)
	if status != 0 {
		t.Fatalf("control client exited %d on %q:\n%s%s", status, script, out, errOut)
	}
	return out
}

// client starts a CUDA client as cred, with env added to the node's.
func (n *node) client(t *testing.T, cred *syscall.Credential, env []string, args ...string) *mpstest.Client {
	t.Helper()
	return mpstest.StartClient(t, bin, append(slices.Clone(n.env), env...), cred, args...)
}

// runClient runs a CUDA client to its end.
func (n *node) runClient(t *testing.T, cred *syscall.Credential, env []string, args ...string) mpstest.ClientResult {
	t.Helper()
	return mpstest.RunClient(t, bin, append(slices.Clone(n.env), env...), cred, args...)
}

// events are the recorded events of role, as "event uid", the UID where
// the event has one.
func (n *node) events(t *testing.T, role string, names ...string) []string {
	t.Helper()
	var out []string
	for _, e := range mpstest.Read(t, n.record) {
		if e.Role != role || !slices.Contains(names, e.Event) {
			continue
		}
		s := e.Event
		if e.UID != nil {
			s += fmt.Sprintf(" %d", *e.UID)
		}
		out = append(out, s)
	}
	return out
}

// waitFor waits until cond holds, at most 10 seconds.
func (n *node) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// waitForClientEvent waits until a client of uid has recorded event.
func (n *node) waitForClientEvent(t *testing.T, event string, uid int) {
	t.Helper()
	n.waitFor(t, fmt.Sprintf("a client of UID %d to %s", uid, event), func() bool {
		return slices.Contains(n.events(t, "client", event), fmt.Sprintf("%s %d", event, uid))
	})
}

// attached is a result of a client that joined a server of uid.
func attached(uid int, percentage float64, pinned int64) mpstest.ClientResult {
	return mpstest.ClientResult{MPS: true, ServerUID: &uid, ActiveThreadPercentage: percentage, PinnedMemLimitBytes: pinned}
}

// failed is r with the error the client printed and its exit status.
func failed(r mpstest.ClientResult, status int, err string) mpstest.ClientResult {
	r.Error, r.ExitCode = err, status
	return r
}

// ignoreServer leaves out the server's ID, a PID.
var ignoreServer = cmpopts.IgnoreFields(mpstest.ClientResult{}, "Server")

const gib = 1 << 30

func TestClientLimits(t *testing.T) {
	const daemonLimits = "set_default_active_thread_percentage 40\nset_default_device_pinned_mem_limit 0 8G\n"
	root := os.Geteuid()
	tests := []struct {
		name    string
		control string
		env     []string
		args    []string
		want    mpstest.ClientResult
	}{
		{
			name: "no limits anywhere",
			want: attached(root, 100, 0),
		},
		{
			name:    "the daemon's bind a client that unsets the variables",
			control: daemonLimits,
			want:    attached(root, 40, 8*gib),
		},
		{
			name:    "a client's above the server's are ignored",
			control: daemonLimits,
			env:     []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=70", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=16G"},
			want:    attached(root, 40, 8*gib),
		},
		{
			name:    "a client's below the server's lower them",
			control: daemonLimits,
			env:     []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=20", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M"},
			want:    attached(root, 20, 1*gib),
		},
		{
			name: "a client's apply where the server has none",
			env:  []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2G,1=1G"},
			want: attached(root, 30, 2*gib),
		},
		{
			name:    "invalid values and other devices' are ignored",
			control: daemonLimits,
			env:     []string{"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=150", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=lots,1=1G"},
			want:    attached(root, 40, 8*gib),
		},
		{
			name:    "an allocation within the limit",
			control: daemonLimits,
			args:    []string{"--alloc=8G"},
			want:    attached(root, 40, 8*gib),
		},
		{
			name:    "an allocation above the limit",
			control: daemonLimits,
			args:    []string{"--alloc=9G"},
			want:    failed(attached(root, 40, 8*gib), mpstest.ExitOutOfMemory, "out of memory: 9663676416 bytes asked, the pinned device memory limit is 8589934592"),
		},
		{
			name:    "an allocation above a limit the client lowered",
			control: daemonLimits,
			env:     []string{"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1G"},
			args:    []string{"--alloc=2G"},
			want:    failed(attached(root, 40, 1*gib), mpstest.ExitOutOfMemory, "out of memory: 2147483648 bytes asked, the pinned device memory limit is 1073741824"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.start(t, "")
			n.mustControl(t, tt.control)
			got := n.runClient(t, nil, tt.env, tt.args...)
			if diff := cmp.Diff(tt.want, got, ignoreServer); diff != "" {
				t.Errorf("client (-want +got):\n%s", diff)
			}
		})
	}
}

func TestServerKeepsTheLimitsItStartedWith(t *testing.T) {
	n := newNode(t)
	n.start(t, "")
	n.mustControl(t, "set_default_active_thread_percentage 40\nset_default_device_pinned_mem_limit 0 8G\n")
	first := n.client(t, nil, nil, "--hold=1m").Result(t)
	server := first.Server

	// The defaults are the next server's.
	n.mustControl(t, "set_default_active_thread_percentage 20\nset_default_device_pinned_mem_limit 0 1G\n")
	root := os.Geteuid()
	if diff := cmp.Diff(attached(root, 40, 8*gib), n.runClient(t, nil, nil), ignoreServer); diff != "" {
		t.Errorf("client after set_default_* (-want +got):\n%s", diff)
	}
	// The server's own apply to the clients that join after.
	n.mustControl(t, fmt.Sprintf("set_active_thread_percentage %s 25\nset_device_pinned_mem_limit %s 0 2G\n", server, server))
	if diff := cmp.Diff(attached(root, 25, 2*gib), n.runClient(t, nil, nil), ignoreServer); diff != "" {
		t.Errorf("client after set_active_thread_percentage (-want +got):\n%s", diff)
	}
	got := n.mustControl(t, fmt.Sprintf("get_server_list\nget_active_thread_percentage %s\nget_device_pinned_mem_limit %s 0\nget_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\n", server, server))
	want := server + "\n25.0\n2048M\n20.0\n1024M\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("limits (-want +got):\n%s", diff)
	}
}

func TestClientsOfAnotherUIDTakeTurns(t *testing.T) {
	needRoot(t)
	n := newNode(t)
	n.start(t, "")
	first := n.client(t, nil, nil, "--hold=1m")
	firstServer := first.Result(t).Server
	// The other UID's client waits for the first's to leave, and so does
	// a client of the first's UID queued behind it.
	other := n.client(t, nobody, nil)
	n.waitForClientEvent(t, "wait", 65534)
	third := n.client(t, nil, nil)
	n.waitForClientEvent(t, "wait", 0)
	if got := n.mustControl(t, "get_server_list\n"); got != firstServer+"\n" {
		t.Errorf("servers while the first client holds = %q, want the first's, %s", got, firstServer)
	}

	first.Release(t)
	want := attached(65534, 100, 0)
	want.Waited = true
	if diff := cmp.Diff(want, other.Result(t), ignoreServer); diff != "" {
		t.Errorf("other UID's client (-want +got):\n%s", diff)
	}
	want = attached(0, 100, 0)
	want.Waited = true
	if diff := cmp.Diff(want, third.Result(t), ignoreServer); diff != "" {
		t.Errorf("third client (-want +got):\n%s", diff)
	}
	wantServers := []string{"server-start 0", "server-exit 0", "server-start 65534", "server-exit 65534", "server-start 0"}
	if diff := cmp.Diff(wantServers, n.events(t, "daemon", "server-start", "server-exit")); diff != "" {
		t.Errorf("servers (-want +got):\n%s", diff)
	}
}

func TestClientOfAnotherUIDReplacesAnIdleServer(t *testing.T) {
	needRoot(t)
	n := newNode(t)
	n.start(t, "")
	if got := n.runClient(t, nil, nil); got.ExitCode != 0 {
		t.Fatalf("first client: %+v", got)
	}
	// The idle server keeps running, for its UID.
	if got := n.mustControl(t, "get_server_list\n"); got == "" {
		t.Error("the server exited with its last client")
	}
	if diff := cmp.Diff(attached(65534, 100, 0), n.runClient(t, nobody, nil), ignoreServer); diff != "" {
		t.Errorf("other UID's client (-want +got):\n%s", diff)
	}
	wantServers := []string{"server-start 0", "server-exit 0", "server-start 65534"}
	if diff := cmp.Diff(wantServers, n.events(t, "daemon", "server-start", "server-exit")); diff != "" {
		t.Errorf("servers (-want +got):\n%s", diff)
	}
}

func TestWaitForAnotherUIDRunsOut(t *testing.T) {
	needRoot(t)
	n := newNode(t)
	n.start(t, "")
	first := n.client(t, nil, nil, "--hold=1m")
	firstServer := first.Result(t).Server

	got := n.runClient(t, nobody, nil, "--wait=200ms")
	want := mpstest.ClientResult{MPS: true, Waited: true, Error: "the MPS server of another UID still had clients after 200ms", ExitCode: mpstest.ExitWaitTimedOut}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("other UID's client (-want +got):\n%s", diff)
	}
	// With no one waiting, the server admits its UID's clients again.
	if got := n.runClient(t, nil, nil); got.Server != firstServer || got.Waited {
		t.Errorf("client of the first's UID after the other gave up: %+v, want server %s, no wait", got, firstServer)
	}
}

// TestClientNeedsTheServersSharedMemory: under the documented rule
// (FAKE_MPS_SHM=shared) a client reaches its server only through the
// server's /dev/shm; by default, as on the H200's driver, it reaches it
// whatever its /dev/shm.
func TestClientNeedsTheServersSharedMemory(t *testing.T) {
	tests := []struct {
		name string
		// shm makes the client's /dev/shm, given the server's and its ID.
		shm func(t *testing.T, serverShm, server string) string
		// wantShared is the client's exit status under the documented
		// rule; by default every client attaches (status 0).
		wantShared int
	}{
		{
			name:       "the server's",
			shm:        func(_ *testing.T, serverShm, _ string) string { return serverShm },
			wantShared: 0,
		},
		{
			name:       "one of its own",
			shm:        func(t *testing.T, _, _ string) string { return t.TempDir() },
			wantShared: mpstest.ExitNoSharedMemory,
		},
		{
			name: "one with a file of the server's name",
			shm: func(t *testing.T, _, server string) string {
				dir := t.TempDir()
				if err := os.WriteFile(filepath.Join(dir, "cuda.shm."+server), []byte("forged"), 0o600); err != nil {
					t.Fatal(err)
				}
				return dir
			},
			wantShared: mpstest.ExitNoSharedMemory,
		},
	}
	for _, rule := range []string{"shared", ""} {
		for _, tt := range tests {
			t.Run(fmt.Sprintf("rule %q/%s", rule, tt.name), func(t *testing.T) {
				n := newNode(t)
				n.start(t, "")
				server := strings.TrimSpace(n.mustControl(t, fmt.Sprintf("start_server -uid %d\nget_server_list\n", os.Geteuid())))
				if _, err := os.Stat(filepath.Join(n.shmDir, "cuda.shm."+server)); err != nil {
					t.Fatalf("the server's shared memory: %v", err)
				}
				want := tt.wantShared
				if rule == "" {
					want = 0
				}
				got := n.runClient(t, nil, []string{"FAKE_MPS_SHM=" + rule, "FAKE_MPS_SHM_DIR=" + tt.shm(t, n.shmDir, server)})
				if got.ExitCode != want || got.MPS != true || got.Server != server || (got.Error == "") != (want == 0) {
					t.Errorf("client = %+v, want status %d on server %s", got, want, server)
				}
			})
		}
	}
}

func TestNoReachableDaemonRunsWithoutMPS(t *testing.T) {
	tests := []struct {
		name string
		// lose makes the daemon, if any, out of reach.
		lose func(t *testing.T, n *node)
	}{
		{
			name: "none started",
			lose: func(*testing.T, *node) {},
		},
		{
			name: "control removed",
			lose: func(t *testing.T, n *node) {
				n.start(t, "")
				if err := os.Remove(filepath.Join(n.pipeDir, "control")); err != nil {
					t.Fatal(err)
				}
			},
		},
		{
			name: "control replaced by a file",
			lose: func(t *testing.T, n *node) {
				n.start(t, "")
				control := filepath.Join(n.pipeDir, "control")
				if err := errors.Join(os.Remove(control), os.WriteFile(control, nil, 0o666)); err != nil {
					t.Fatal(err)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			tt.lose(t, n)
			if diff := cmp.Diff(mpstest.ClientResult{MPS: false}, n.runClient(t, nil, nil)); diff != "" {
				t.Errorf("CUDA client (-want +got):\n%s", diff)
			}
			_, stderr, status := n.control(t, nil, "get_server_list\n")
			if status != 1 || !strings.HasPrefix(stderr, "Cannot find MPS control daemon process") {
				t.Errorf("control client exited %d, %q; want 1, Cannot find MPS control daemon process", status, stderr)
			}
			if n.daemon != nil && n.daemon.ProcessState != nil {
				t.Error("the daemon out of reach exited; it should run on")
			}
		})
	}
}

func TestControlSocketIsEveryUsersWhateverTheUmask(t *testing.T) {
	n := newNode(t)
	n.start(t, "umask 077; ")
	info, err := os.Lstat(filepath.Join(n.pipeDir, "control"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(os.ModeSocket|0o666, info.Mode()); diff != "" {
		t.Errorf("control's mode (-want +got):\n%s", diff)
	}
	if uid := info.Sys().(*syscall.Stat_t).Uid; int(uid) != os.Geteuid() {
		t.Errorf("control belongs to UID %d, want the daemon's %d", uid, os.Geteuid())
	}
}

func TestQuitEndsTheDaemonAndItsServer(t *testing.T) {
	tests := []struct {
		name string
		// cred is the user that sends quit: any that reaches control may.
		cred *syscall.Credential
	}{
		{name: "the daemon's user"},
		{name: "another user", cred: nobody},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.cred != nil {
				needRoot(t)
			}
			n := newNode(t)
			n.start(t, "")
			held := n.client(t, nil, nil, "--hold=1m")
			server := held.Result(t).Server
			if out, stderr, status := n.control(t, tt.cred, "quit\n"); status != 0 {
				t.Fatalf("quit exited %d: %s%s", status, out, stderr)
			}
			if err := n.daemon.Wait(); err != nil {
				t.Errorf("daemon: %v", err)
			}
			if got := held.Release(t); got.ExitCode != mpstest.ExitServerFailed {
				t.Errorf("the held client exited %d, want %d: its server is gone", got.ExitCode, mpstest.ExitServerFailed)
			}
			for _, gone := range []string{filepath.Join(n.pipeDir, "control"), filepath.Join(n.shmDir, "cuda.shm."+server)} {
				if _, err := os.Lstat(gone); !os.IsNotExist(err) {
					t.Errorf("%s remains: %v", gone, err)
				}
			}
			want := []string{"start", "server-start 0", "server-exit 0", "exit"}
			if diff := cmp.Diff(want, n.events(t, "daemon", "start", "server-start", "server-exit", "exit")); diff != "" {
				t.Errorf("daemon (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKilledDaemonLeavesNoSharedMemory(t *testing.T) {
	n := newNode(t)
	n.start(t, "")
	server := n.client(t, nil, nil, "--hold=1m").Result(t).Server
	shm := filepath.Join(n.shmDir, "cuda.shm."+server)
	if _, err := os.Stat(shm); err != nil {
		t.Fatalf("the server's shared memory: %v", err)
	}
	if err := syscall.Kill(-n.daemon.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	n.waitFor(t, "the server to remove its shared memory", func() bool {
		_, err := os.Stat(shm)
		return os.IsNotExist(err)
	})
}

func TestControlCommands(t *testing.T) {
	tests := []struct {
		name       string
		script     string
		want       string
		wantStatus int
	}{
		{
			name:   "defaults",
			script: "get_default_active_thread_percentage\nget_default_device_pinned_mem_limit 0\nget_server_list\n",
			want:   "100.0\n0\n",
		},
		{
			name:   "set and get defaults",
			script: "set_default_active_thread_percentage 12.5\nset_default_device_pinned_mem_limit 1 8G\nget_default_active_thread_percentage\nget_default_device_pinned_mem_limit 1\nget_default_device_pinned_mem_limit 0\n",
			want:   "12.5\n8192M\n0\n",
		},
		{
			name:       "an unknown command fails at the end",
			script:     "no_such_command\nget_default_active_thread_percentage\n",
			want:       "Error: unknown command \"no_such_command\"\n100.0\n",
			wantStatus: 1,
		},
		{
			name:       "malformed arguments",
			script:     "set_default_active_thread_percentage 150\nset_default_device_pinned_mem_limit 0 8X\nset_default_device_pinned_mem_limit 0\nstart_server 0\n",
			want:       "Error: invalid active thread percentage \"150\": want a number above 0 and at most 100\nError: invalid memory value \"8X\": want a positive count with an optional suffix, K, M, G or T, such as 8G\nError: usage: set_default_device_pinned_mem_limit DEV VALUE\nError: usage: start_server -uid UID\n",
			wantStatus: 1,
		},
		{
			name:       "a server that does not run",
			script:     "get_active_thread_percentage 1\nget_client_list 1\n",
			want:       "Error: no MPS server with ID 1\nError: no MPS server with ID 1\n",
			wantStatus: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNode(t)
			n.start(t, "")
			got, _, status := n.control(t, nil, tt.script)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("output (-want +got):\n%s", diff)
			}
			if status != tt.wantStatus {
				t.Errorf("exit status = %d, want %d", status, tt.wantStatus)
			}
		})
	}
}

func TestOneServerAtATime(t *testing.T) {
	n := newNode(t)
	n.start(t, "")
	uid := os.Geteuid()
	server := strings.TrimSpace(n.mustControl(t, fmt.Sprintf("start_server -uid %d\nget_server_list\n", uid)))
	out, _, status := n.control(t, nil, fmt.Sprintf("start_server -uid %d\n", uid))
	if want := fmt.Sprintf("Error: an MPS server is already running: %s, of UID %d\n", server, uid); out != want || status != 1 {
		t.Errorf("second start_server = %q, status %d; want %q, 1", out, status, want)
	}
	held := n.client(t, nil, nil, "--hold=1m")
	if got := held.Result(t).Server; got != server {
		t.Errorf("client joined server %s, want the running %s", got, server)
	}
	if got := n.mustControl(t, "get_client_list "+server+"\n"); got != fmt.Sprintf("%d\n", held.PID()) {
		t.Errorf("get_client_list = %q, want the held client's PID %d", got, held.PID())
	}
}
