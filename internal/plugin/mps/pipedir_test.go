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

package mps

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/mountpoint"
)

// Tenants of a GPU's shares, as the UIDs their containers run as.
const (
	tenant      = 65534
	otherTenant = 65533
)

// fakePropagation makes mounts under the state directory reach the host,
// or not (err), whatever this host's mount table says.
func fakePropagation(t *testing.T, err error) {
	t.Helper()
	prev := propagates
	propagates = func(string) error { return err }
	t.Cleanup(func() { propagates = prev })
}

// allowMounts lets the manager mount pipe directories' tmpfs for real,
// which needs root: as root a failing mount is a failure, not a reason to
// skip. Call it after newEnv.
func allowMounts(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	fakePropagation(t, nil)
}

// file is what the test sees of a file in a pipe directory.
type file struct {
	UID  uint32
	Type string
}

func lstat(t *testing.T, path string) file {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); errors.Is(err, unix.ENOENT) {
		return file{Type: "none"}
	} else if err != nil {
		t.Fatal(err)
	}
	types := map[uint32]string{unix.S_IFIFO: "pipe", unix.S_IFSOCK: "socket", unix.S_IFREG: "file", unix.S_IFDIR: "directory"}
	return file{UID: st.Uid, Type: types[st.Mode&unix.S_IFMT]}
}

// daemonsControl is what a listening daemon's control pipe looks like: the
// stand-in's is a socket.
func daemonsControl() file { return file{UID: uint32(os.Geteuid()), Type: "socket"} }

// asTenant runs a shell script as uid, in dir, as a container of a share
// runs in the pipe directory it mounts, with the control client as
// $CONTROL and the pipe directory as CUDA_MPS_PIPE_DIRECTORY.
func asTenant(t *testing.T, e *env, uid int, dir, script string) error {
	t.Helper()
	cmd := exec.Command("/bin/sh", "-c", script)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CONTROL="+filepath.Join(e.driverRoot, "usr", "bin", ControlBinary), EnvPipeDirectory+"="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	out, err := cmd.CombinedOutput()
	t.Logf("as UID %d: %s: %v %s", uid, script, err, strings.TrimSpace(string(out)))
	return err
}

// TestTenantsCannotTakeTheDaemonsPipes: every tenant may write to the pipe
// directory and reach the daemon, but none may remove, rename or replace
// the daemon's control pipe or another tenant's file. As root, the test
// plays the tenants with UIDs of their own; otherwise it checks the mode
// that makes it so.
func TestTenantsCannotTakeTheDaemonsPipes(t *testing.T) {
	if _, err := os.Stat("/bin/sh"); err != nil && os.Geteuid() == 0 {
		t.Fatalf("the tenants' scripts need /bin/sh: %v", err)
	}
	for _, tc := range []struct {
		name    string
		script  string
		wantErr bool
		// wantCommand is what the daemon must have read from its pipe.
		wantCommand string
	}{
		{name: "remove the daemon's control pipe", script: "rm -f control", wantErr: true},
		{name: "rename it", script: "mv -f control moved", wantErr: true},
		{name: "put a file of its own in its place", script: "echo x >mine && mv -f mine control", wantErr: true},
		{name: "remove another tenant's file", script: "rm -f theirs", wantErr: true},
		{name: "create a file of its own", script: "echo x >mine"},
		{name: "reach the daemon", script: "echo get_server_list | $CONTROL", wantCommand: "get_server_list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			m, _ := e.start(t)
			ensure(t, m, gpuA)
			pipe := m.PipeDir(gpuA)
			info, err := os.Lstat(pipe)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(os.ModeDir|os.ModeSticky|0o777, info.Mode()); diff != "" {
				t.Errorf("mode of the pipe directory (-want +got):\n%s", diff)
			}
			if os.Geteuid() != 0 {
				t.Skip("playing tenants of other UIDs needs root; the mode is checked")
			}
			// A container reaches the directory through its bind mount; the
			// tenants here, through the test's directories above it.
			for _, dir := range []string{filepath.Dir(e.state), e.state, filepath.Dir(e.driverRoot), e.driverRoot} {
				if err := os.Chmod(dir, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := asTenant(t, e, otherTenant, pipe, "echo x >theirs"); err != nil {
				t.Fatalf("a tenant cannot create a file in the pipe directory: %v", err)
			}
			err = asTenant(t, e, tenant, pipe, tc.script)
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Errorf("tenant's %q: error %v, want an error: %v", tc.script, err, tc.wantErr)
			}
			want := map[string]file{controlPipe: daemonsControl(), "theirs": {UID: otherTenant, Type: "file"}}
			got := map[string]file{controlPipe: lstat(t, filepath.Join(pipe, controlPipe)), "theirs": lstat(t, filepath.Join(pipe, "theirs"))}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("the daemon's and the other tenant's files after %q (-want +got):\n%s", tc.script, diff)
			}
			if tc.wantCommand == "" {
				return
			}
			err = wait.PollUntilContextTimeout(t.Context(), 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				return slices.Contains(e.events(t, "daemon"), "command "+tc.wantCommand), nil
			})
			if err != nil {
				t.Errorf("the daemon did not read %q from a tenant: %v", tc.wantCommand, e.events(t, "daemon"))
			}
		})
	}
}

// TestUnreachableDaemonIsReplaced: a daemon that runs but whose control
// pipe is gone, or not its own, serves no new client. The next share's
// Ensure, or a restarted plugin, kills it at once (it cannot be told to
// quit) and starts a fresh one on the same pipe directory.
func TestUnreachableDaemonIsReplaced(t *testing.T) {
	for _, tc := range []struct {
		name     string
		needRoot bool
		tamper   func(t *testing.T, control string)
	}{{
		name:   "control pipe removed",
		tamper: func(t *testing.T, control string) {},
	}, {
		name: "control pipe replaced by a file",
		tamper: func(t *testing.T, control string) {
			if err := os.WriteFile(control, nil, 0o666); err != nil {
				t.Fatal(err)
			}
		},
	}, {
		name:     "control pipe replaced by a tenant's pipe",
		needRoot: true,
		tamper: func(t *testing.T, control string) {
			if err := errors.Join(unix.Mkfifo(control, 0o666), os.Chown(control, tenant, tenant)); err != nil {
				t.Fatal(err)
			}
		},
	}} {
		for _, restart := range []bool{false, true} {
			name := tc.name + ", found by the next share"
			if restart {
				name = tc.name + ", found by a restarted plugin"
			}
			t.Run(name, func(t *testing.T) {
				if tc.needRoot && os.Geteuid() != 0 {
					t.Skip("giving the pipe to another UID needs root")
				}
				e := newEnv(t)
				m, reg := e.start(t)
				ensure(t, m, gpuA)
				old := e.daemon(t, gpuA)
				control := filepath.Join(old.PipeDir, controlPipe)
				if err := os.Remove(control); err != nil {
					t.Fatal(err)
				}
				tc.tamper(t, control)

				if restart {
					m, reg = e.start(t)
					if _, err := m.Recover(t.Context(), need(gpuA)); err != nil {
						t.Fatal(err)
					}
				} else {
					err := m.Ensure(t.Context(), daemonFor(gpuA))
					var replaced *ReplacedError
					if !errors.As(err, &replaced) || replaced.PID != old.PID || !strings.Contains(replaced.Reason, "control pipe") {
						t.Errorf("Ensure = %v, want a ReplacedError for daemon %d that names its control pipe", err, old.PID)
					}
				}
				fresh := e.daemon(t, gpuA)
				if fresh.PID == old.PID || !alive(fresh.PID) || alive(old.PID) {
					t.Errorf("daemons after the check: old %d alive %v, recorded %d alive %v; want the old one killed and a fresh one",
						old.PID, alive(old.PID), fresh.PID, alive(fresh.PID))
				}
				if fresh.PipeDir != old.PipeDir {
					t.Errorf("fresh daemon serves %s, want the pipe directory the containers mount, %s", fresh.PipeDir, old.PipeDir)
				}
				if diff := cmp.Diff(daemonsControl(), lstat(t, control)); diff != "" {
					t.Errorf("control pipe of the fresh daemon (-want +got):\n%s", diff)
				}
				// The old daemon was never told to quit: it could not be.
				if diff := cmp.Diff([]string{"start ", "start "}, e.events(t, "daemon")); diff != "" {
					t.Errorf("daemon records (-want +got):\n%s", diff)
				}
				// A restarted plugin counts from zero.
				wantStarts := map[string]float64{"started": 1, "restarted": 1}
				if restart {
					wantStarts = map[string]float64{"restarted": 1}
				}
				if diff := cmp.Diff(wantStarts, metricstest.Counters(t, reg, "prism_plugin_mps_daemon_starts_total", "result")); diff != "" {
					t.Errorf("daemon starts (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(map[string]float64{"unreachable": 1}, metricstest.Counters(t, reg, "prism_plugin_mps_daemon_stops_total", "result")); diff != "" {
					t.Errorf("daemon stops (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestStopDoesNotWaitForAnUnreachableDaemon: the last share's unprepare,
// which holds the driver lock, tells a listening daemon to quit and waits
// for it; a daemon whose control pipe is gone cannot be told, so it is
// killed at once rather than after the stop timeout.
func TestStopDoesNotWaitForAnUnreachableDaemon(t *testing.T) {
	for _, tc := range []struct {
		name       string
		removePipe bool
		wantEvents []string
		wantStops  map[string]float64
	}{
		{name: "listening: told to quit", wantEvents: []string{"start ", "command quit", "exit "}, wantStops: map[string]float64{"quit": 1}},
		{name: "control pipe removed: killed at once", removePipe: true, wantEvents: []string{"start "}, wantStops: map[string]float64{"unreachable": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			m, reg := e.start(t)
			ensure(t, m, gpuA)
			rec := e.daemon(t, gpuA)
			if tc.removePipe {
				if err := os.Remove(filepath.Join(rec.PipeDir, controlPipe)); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Stop(t.Context(), gpuA); err != nil {
				t.Fatal(err)
			}
			if alive(rec.PID) {
				t.Errorf("daemon %d still runs after Stop", rec.PID)
			}
			if diff := cmp.Diff(tc.wantStops, metricstest.Counters(t, reg, "prism_plugin_mps_daemon_stops_total", "result")); diff != "" {
				t.Errorf("how the daemon was stopped (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantEvents, e.events(t, "daemon")); diff != "" {
				t.Errorf("daemon records (-want +got):\n%s", diff)
			}
			if _, err := os.Stat(filepath.Dir(rec.PipeDir)); !os.IsNotExist(err) {
				t.Errorf("the stopped daemon's directories remain: %v", err)
			}
		})
	}
}

// TestPipeDirIsABoundedTmpfs: where the plugin can mount a tmpfs that the
// host sees, a GPU's pipe directory is one, so that what tenants write
// there (the finding wrote 64 MiB) fills neither the host's disk nor more
// than PipeDirSize. A replaced daemon keeps the mount that containers
// have, and the last share's end unmounts it.
func TestPipeDirIsABoundedTmpfs(t *testing.T) {
	e := newEnv(t)
	allowMounts(t)
	m, _ := e.start(t)
	if err := m.Unbounded(); err != nil {
		t.Fatalf("pipe directories unbounded: %v", err)
	}
	ensure(t, m, gpuA)
	pipe := m.PipeDir(gpuA)
	var fs unix.Statfs_t
	if err := unix.Statfs(pipe, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Fatalf("pipe directory is on a file system of type %#x, want a tmpfs", fs.Type)
	}
	if got, want := uint64(fs.Blocks)*uint64(fs.Bsize), uint64(16<<20); got != want {
		t.Errorf("pipe directory's tmpfs holds %d bytes, want %d", got, want)
	}
	// The share's /dev/shm: room for a data loader's batches, charged to
	// the container that writes them.
	var shm unix.Statfs_t
	if err := unix.Statfs(m.ShmDir(gpuA), &shm); err != nil {
		t.Fatal(err)
	}
	if got, want := [3]uint64{uint64(shm.Type), uint64(shm.Blocks) * uint64(shm.Bsize), shm.Files}, [3]uint64{unix.TMPFS_MAGIC, 8 << 30, 65536}; got != want {
		t.Errorf("shared-memory directory's file system (type, bytes, files) = %#x, want %#x", got, want)
	}
	info, err := os.Lstat(pipe)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(os.ModeDir|os.ModeSticky|0o777, info.Mode()); diff != "" {
		t.Errorf("mode of the pipe directory (-want +got):\n%s", diff)
	}
	f, err := os.Create(filepath.Join(pipe, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write(make([]byte, 64<<20))
	f.Close()
	if !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing 64 MiB into the pipe directory: %v, want ENOSPC", err)
	}
	var before unix.Stat_t
	if err := unix.Stat(pipe, &before); err != nil {
		t.Fatal(err)
	}

	// A daemon replaced on the same pipe directory keeps its tmpfs.
	if err := os.Remove(filepath.Join(pipe, controlPipe)); err != nil {
		t.Fatal(err)
	}
	var replaced *ReplacedError
	if err := m.Ensure(t.Context(), daemonFor(gpuA)); !errors.As(err, &replaced) {
		t.Fatalf("Ensure = %v, want the daemon replaced", err)
	}
	var after unix.Stat_t
	if err := unix.Stat(pipe, &after); err != nil {
		t.Fatal(err)
	}
	if after.Dev != before.Dev {
		t.Errorf("the replaced daemon's pipe directory is on device %#x, want the tmpfs the containers mount, %#x", after.Dev, before.Dev)
	}
	if entries, _ := os.ReadDir(pipe); len(entries) != 1 || entries[0].Name() != controlPipe {
		t.Errorf("pipe directory of the fresh daemon holds %v, want its control pipe alone", entries)
	}

	if err := m.Stop(t.Context(), gpuA); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(pipe)); !os.IsNotExist(err) {
		t.Errorf("the stopped daemon's directories remain: %v", err)
	}
}

// TestPipeDirsArePlainWhereNoTmpfsCanBeMounted: a plugin whose mounts
// would not reach the host, or that may not mount, keeps plain pipe
// directories, says why, and still serves shares.
func TestPipeDirsArePlainWhereNoTmpfsCanBeMounted(t *testing.T) {
	for _, tc := range []struct {
		name        string
		propagation error
		mountErr    error
		wantErr     string
	}{
		{name: "mounts do not reach the host", propagation: errors.New("the mount / that holds it is not shared"), wantErr: "not shared"},
		{name: "the plugin may not mount", mountErr: unix.EPERM, wantErr: "operation not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			fakePropagation(t, tc.propagation)
			var mounts []string
			prev := mount
			mount = func(source, target, fstype string, flags uintptr, data string) error {
				mounts = append(mounts, target)
				if tc.mountErr != nil {
					return tc.mountErr
				}
				return prev(source, target, fstype, flags, data)
			}
			t.Cleanup(func() { mount = prev })
			m, _ := e.start(t)
			if err := m.Unbounded(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Unbounded() = %v, want an error containing %q", err, tc.wantErr)
			}
			tried := len(mounts)
			ensure(t, m, gpuA)
			if len(mounts) != tried {
				t.Errorf("mounted %v on a plugin whose pipe directories are unbounded", mounts[tried:])
			}
			if mounted, err := mountpoint.Is(m.PipeDir(gpuA)); err != nil || mounted {
				t.Errorf("pipe directory is a mount point: %v %v", mounted, err)
			}
		})
	}
}

// TestSharedIn: only a shared mount, the innermost that holds the
// directory, carries a tmpfs to the host.
func TestSharedIn(t *testing.T) {
	const root = "1 0 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
	for _, tc := range []struct {
		name, mountinfo, dir string
		want                 bool
	}{
		{"Bidirectional hostPath", root + "2 1 8:1 /var/lib/prism /var/lib/prism rw shared:5 master:1 - ext4 /dev/sda1 rw\n", "/var/lib/prism/mps", true},
		{"HostToContainer hostPath", root + "2 1 8:1 /var/lib/prism /var/lib/prism rw master:5 - ext4 /dev/sda1 rw\n", "/var/lib/prism/mps", false},
		{"private", root + "2 1 8:1 /var/lib/prism /var/lib/prism rw - ext4 /dev/sda1 rw\n", "/var/lib/prism/mps", false},
		{"plugin on a systemd host", "1 0 8:1 / / rw shared:1 - ext4 /dev/sda1 rw\n", "/var/lib/prism/mps", true},
		{"a private mount on top of a shared one", root + "2 1 8:1 /p /var/lib/prism rw shared:5 - ext4 /dev/sda1 rw\n3 2 0:9 / /var/lib/prism rw - tmpfs t rw\n", "/var/lib/prism/mps", false},
		{"a sibling with a common prefix is not the parent", root + "2 1 8:1 /p /var/lib/pri rw shared:5 - ext4 /dev/sda1 rw\n", "/var/lib/prism/mps", false},
		{"escaped space", root + `2 1 8:1 /p /var/lib/my\040prism rw shared:5 - ext4 /dev/sda1 rw` + "\n", "/var/lib/my prism/mps", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := sharedIn(strings.NewReader(tc.mountinfo), tc.dir)
			if diff := cmp.Diff(tc.want, err == nil); diff != "" {
				t.Errorf("shared (-want +got):\n%s\nerror: %v", diff, err)
			}
		})
	}
}
