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
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

const (
	gpuA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	gpuB = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
)

// env is one node: a driver root with the stand-in control binary and a
// plugin state directory. Each manager made from it is a plugin start.
type env struct {
	driverRoot, record, state string
	store                     *checkpoint.Store
}

func newEnv(t *testing.T) *env {
	t.Helper()
	e := &env{state: t.TempDir()}
	e.driverRoot, e.record = mpstest.DriverRoot(t)
	// Pipe directories are plain directories, whatever the host's mounts,
	// unless the test allows tmpfs mounts (see allowMounts).
	fakePropagation(t, errors.New("the test's mounts do not reach a host"))
	mpstest.UnmountAtCleanup(t, e.state)
	// No daemon outlives its test, whatever the test did to it.
	t.Cleanup(func() {
		if e.store == nil {
			return
		}
		for _, rec := range e.store.MPSDaemons() {
			if rec.PID > 0 {
				_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
			}
		}
		e.store.Close()
	})
	return e
}

// start opens the checkpoint again and makes a manager, as a restarted
// plugin does.
func (e *env) start(t *testing.T) (*Manager, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	return New(e.reopen(t, Options{Registerer: reg})), reg
}

// reopen opens the checkpoint again, as a restarted plugin does, and
// completes opts with it and the node's driver root and state directory.
func (e *env) reopen(t *testing.T, opts Options) Options {
	t.Helper()
	if e.store != nil {
		e.store.Close()
	}
	store, _, err := checkpoint.Open(t.Context(), e.state, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e.store = store
	opts.DriverRoot, opts.Root, opts.Checkpoint = e.driverRoot, filepath.Join(e.state, "mps"), store
	return opts
}

// daemonFor is the daemon of a test's share, named by its GPU's UUID: one
// daemon per GPU, without limits.
func daemonFor(uuid string) Daemon { return Daemon{Key: uuid, UUID: uuid} }

// need is what a restarted plugin needs: the daemons of these GPUs.
func need(uuids ...string) map[string]Daemon {
	out := map[string]Daemon{}
	for _, uuid := range uuids {
		out[uuid] = daemonFor(uuid)
	}
	return out
}

// ensure has m ensure a daemon for each share, named by its GPU's UUID.
func ensure(t *testing.T, m *Manager, uuids ...string) {
	t.Helper()
	for _, uuid := range uuids {
		if err := m.Ensure(t.Context(), daemonFor(uuid)); err != nil {
			t.Fatal(err)
		}
	}
}

// restart starts the manager again, as a restarted plugin does, and
// recovers with the GPUs that still have shares.
func (e *env) restart(t *testing.T, shared map[string]Daemon) *Manager {
	t.Helper()
	m, _ := e.start(t)
	if _, err := m.Recover(t.Context(), shared); err != nil {
		t.Fatal(err)
	}
	return m
}

// events are the stand-in's records of one role, as "event command".
func (e *env) events(t *testing.T, role string) []string {
	t.Helper()
	var out []string
	for _, entry := range mpstest.Read(t, e.record) {
		if entry.Role == role {
			out = append(out, entry.Event+" "+entry.Command)
		}
	}
	return out
}

func (e *env) daemon(t *testing.T, uuid string) checkpoint.MPSDaemon {
	t.Helper()
	rec, ok := e.store.MPSDaemons()[uuid]
	if !ok || rec.PID <= 0 {
		t.Fatalf("no running daemon recorded for %s: %+v", uuid, e.store.MPSDaemons())
	}
	return rec
}

func alive(pid int) bool {
	state, _, err := procStat("/proc", pid)
	return err == nil && state != 'Z' && state != 'X'
}

// waitExit waits until a killed daemon is gone; the test binary's timeout
// bounds it.
func waitExit(pid int) {
	for alive(pid) {
		time.Sleep(10 * time.Millisecond)
	}
}

func TestDaemonStartsOnceAndStopsWithItsDirectories(t *testing.T) {
	e := newEnv(t)
	m, reg := e.start(t)
	if err := m.Unavailable(); err != nil {
		t.Fatalf("stand-in control binary not found: %v", err)
	}
	// Two shares of one GPU, one of another.
	ensure(t, m, gpuA, gpuA, gpuB)
	a := e.daemon(t, gpuA)
	dir := filepath.Join(e.state, "mps", gpuA)
	want := checkpoint.MPSDaemon{UUID: gpuA, PipeDir: filepath.Join(dir, "pipe"), LogDir: filepath.Join(dir, "log"), ShmDir: filepath.Join(dir, "shm")}
	if diff := cmp.Diff(want, a, cmpopts.IgnoreFields(checkpoint.MPSDaemon{}, "PID", "StartTicks", "Started")); diff != "" {
		t.Errorf("daemon record (-want +got):\n%s", diff)
	}
	if !alive(a.PID) {
		t.Errorf("daemon %d of %s is not running", a.PID, gpuA)
	}
	// The pipe and shared-memory directories are the share's clients', the
	// log directory their servers', whatever their users.
	for _, dir := range []string{a.PipeDir, a.ShmDir, a.LogDir} {
		info, err := os.Stat(dir)
		if err != nil {
			t.Error(err)
		} else if info.Mode() != os.ModeDir|os.ModeSticky|0o777 {
			t.Errorf("%s has mode %v, want a directory of mode 1777", dir, info.Mode())
		}
	}
	var starts []mpstest.Entry
	for _, entry := range mpstest.Read(t, e.record) {
		if entry.Event == "start" {
			starts = append(starts, entry)
		}
	}
	wantStarts := []mpstest.Entry{
		{Role: "daemon", Event: "start", Args: []string{"-f"}, PipeDir: m.PipeDir(gpuA), VisibleDevices: gpuA},
		{Role: "daemon", Event: "start", Args: []string{"-f"}, PipeDir: m.PipeDir(gpuB), VisibleDevices: gpuB},
	}
	if diff := cmp.Diff(wantStarts, starts, cmpopts.IgnoreFields(mpstest.Entry{}, "PID")); diff != "" {
		t.Errorf("daemons started (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(m.metrics.daemons); got != 2 {
		t.Errorf("prism_plugin_mps_daemons = %v, want 2", got)
	}

	if err := m.Stop(t.Context(), gpuA); err != nil {
		t.Fatal(err)
	}
	waitExit(a.PID)
	if _, ok := e.store.MPSDaemons()[gpuA]; ok {
		t.Error("the stopped daemon is still recorded")
	}
	if _, err := os.Stat(filepath.Join(e.state, "mps", gpuA)); !os.IsNotExist(err) {
		t.Errorf("the stopped daemon's directories remain: %v", err)
	}
	if diff := cmp.Diff([]string{"start ", "start ", "command quit", "exit "}, e.events(t, "daemon")); diff != "" {
		t.Errorf("daemon records (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"run "}, e.events(t, "client")); diff != "" {
		t.Errorf("quit is sent through the control client (-want +got):\n%s", diff)
	}
	if got := testutil.ToFloat64(m.metrics.starts.WithLabelValues(ResultStarted)); got != 2 {
		t.Errorf("starts{result=started} = %v, want 2", got)
	}
	if n, err := testutil.GatherAndCount(reg, "prism_plugin_mps_daemons"); err != nil || n != 1 {
		t.Errorf("prism_plugin_mps_daemons not registered: %d series, %v", n, err)
	}
}

func TestRestartedPluginAdoptsARunningDaemon(t *testing.T) {
	e := newEnv(t)
	m, _ := e.start(t)
	ensure(t, m, gpuA)
	before := e.daemon(t, gpuA)

	m = e.restart(t, need(gpuA))
	if diff := cmp.Diff(before, e.daemon(t, gpuA)); diff != "" {
		t.Errorf("adopted daemon's record changed (-before +after):\n%s", diff)
	}
	if got := testutil.ToFloat64(m.metrics.starts.WithLabelValues(ResultAdopted)); got != 1 {
		t.Errorf("starts{result=adopted} = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.metrics.daemons); got != 1 {
		t.Errorf("prism_plugin_mps_daemons = %v, want 1", got)
	}
	if diff := cmp.Diff([]string{"start "}, e.events(t, "daemon")); diff != "" {
		t.Errorf("adoption started or stopped a daemon (-want +got):\n%s", diff)
	}
	// An Ensure for the next share uses the adopted daemon.
	ensure(t, m, gpuA)
	if got := e.daemon(t, gpuA).PID; got != before.PID {
		t.Errorf("daemon PID %d after Ensure, want the adopted %d", got, before.PID)
	}
}

func TestDeadDaemonIsReplacedWhileSharesRemain(t *testing.T) {
	for name, restart := range map[string]bool{"found by the next share": false, "found by a restarted plugin": true} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			m, _ := e.start(t)
			ensure(t, m, gpuA)
			dead := e.daemon(t, gpuA)
			if err := syscall.Kill(dead.PID, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			waitExit(dead.PID)
			if restart {
				m, _ = e.start(t)
				replaced, err := m.Recover(t.Context(), need(gpuA))
				if err != nil || len(replaced) != 1 || replaced[0].PID != dead.PID || replaced[0].Key != gpuA {
					t.Errorf("Recover = %v, %v; want the dead daemon %d replaced", replaced, err, dead.PID)
				}
			} else {
				err := m.Ensure(t.Context(), daemonFor(gpuA))
				var replaced *ReplacedError
				if !errors.As(err, &replaced) || replaced.PID != dead.PID {
					t.Errorf("Ensure = %v, want a ReplacedError for the dead daemon %d", err, dead.PID)
				}
			}
			fresh := e.daemon(t, gpuA)
			if fresh.PID == dead.PID || !alive(fresh.PID) {
				t.Errorf("daemon %d recorded after %d died, want a fresh live one", fresh.PID, dead.PID)
			}
			if fresh.PipeDir != dead.PipeDir {
				t.Errorf("fresh daemon serves %s, want the pipe directory the containers mount, %s", fresh.PipeDir, dead.PipeDir)
			}
			if got := testutil.ToFloat64(m.metrics.starts.WithLabelValues(ResultRestarted)); got != 1 {
				t.Errorf("starts{result=restarted} = %v, want 1", got)
			}
		})
	}
}

func TestRecoverStopsDaemonsWithoutShares(t *testing.T) {
	e := newEnv(t)
	m, _ := e.start(t)
	ensure(t, m, gpuA, gpuB)
	a := e.daemon(t, gpuA)
	e.restart(t, need(gpuB))
	waitExit(a.PID)
	if diff := cmp.Diff([]string{gpuB}, mapKeys(e.store.MPSDaemons())); diff != "" {
		t.Errorf("daemons recorded after recovery (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(e.state, "mps", gpuA)); !os.IsNotExist(err) {
		t.Errorf("directories of the stopped daemon remain: %v", err)
	}
}

// TestInterruptedStartIsCleanedUp: a record without a PID is a start that
// a crash cut short; with no share left it is removed, directories and all.
func TestInterruptedStartIsCleanedUp(t *testing.T) {
	e := newEnv(t)
	m, _ := e.start(t)
	rec := checkpoint.MPSDaemon{UUID: gpuA, PipeDir: m.PipeDir(gpuA), LogDir: m.logDir(gpuA)}
	if err := emptyDir(rec.PipeDir); err != nil {
		t.Fatal(err)
	}
	if err := m.record(t.Context(), gpuA, rec); err != nil {
		t.Fatal(err)
	}
	e.restart(t, nil)
	if got := e.store.MPSDaemons(); len(got) != 0 {
		t.Errorf("records left: %+v", got)
	}
	if _, err := os.Stat(filepath.Dir(rec.PipeDir)); !os.IsNotExist(err) {
		t.Errorf("directories left: %v", err)
	}
}

func TestWithoutControlBinaryMPSIsUnavailable(t *testing.T) {
	store, _, err := checkpoint.Open(t.Context(), t.TempDir(), checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m := New(Options{DriverRoot: t.TempDir(), Root: t.TempDir(), Checkpoint: store})
	if m.Unavailable() == nil {
		t.Fatal("a driver root without nvidia-cuda-mps-control reported MPS available")
	}
	if err := m.Ensure(t.Context(), daemonFor(gpuA)); err == nil {
		t.Error("Ensure started a daemon without a control binary")
	}
	if got := testutil.ToFloat64(m.metrics.available); got != 0 {
		t.Errorf("prism_plugin_mps_available = %v, want 0", got)
	}
}

// TestRunningTellsTheDaemonFromOtherProcesses: a recorded PID counts only
// while it is the same process, running the control binary, on the
// recorded pipe directory. The test's own process stands in for a PID
// reused by something else.
func TestRunningTellsTheDaemonFromOtherProcesses(t *testing.T) {
	self := os.Getpid()
	_, ticks, err := procStat("/proc", self)
	if err != nil {
		t.Fatal(err)
	}
	for name, rec := range map[string]checkpoint.MPSDaemon{
		"start interrupted":           {PID: 0},
		"PID started at another time": {PID: self, StartTicks: ticks + 1},
		"PID runs another program":    {PID: self, StartTicks: ticks, PipeDir: "/x"},
	} {
		if ok, why := running("/proc", ControlBinary, rec); ok || why == "" {
			t.Errorf("%s: running = %v (%q), want false with a reason", name, ok, why)
		}
	}
}

func mapKeys(m map[string]checkpoint.MPSDaemon) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestFindControl: the control binary is found where driver packages and
// GKE-style driver roots put it, and only as an executable file.
func TestFindControl(t *testing.T) {
	for _, tc := range []struct {
		name string
		// path is where the test puts something named like the binary,
		// relative to the driver root; mode its mode, 0 a directory.
		path string
		mode os.FileMode
		want string
	}{
		{name: "driver package", path: "usr/bin", mode: 0o755, want: "usr/bin"},
		{name: "GKE-style root", path: "bin", mode: 0o755, want: "bin"},
		{name: "elsewhere", path: "sbin", mode: 0o755},
		{name: "not executable", path: "usr/bin", mode: 0o644},
		{name: "a directory", path: "usr/bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			p := filepath.Join(root, tc.path, ControlBinary)
			var err error
			if tc.mode == 0 {
				err = os.MkdirAll(p, 0o755)
			} else if err = os.MkdirAll(filepath.Dir(p), 0o755); err == nil {
				err = os.WriteFile(p, nil, tc.mode)
			}
			if err != nil {
				t.Fatal(err)
			}
			want := ""
			if tc.want != "" {
				want = filepath.Join(root, tc.want, ControlBinary)
			}
			if got := findControl(root); got != want {
				t.Errorf("findControl = %q, want %q", got, want)
			}
		})
	}
}
