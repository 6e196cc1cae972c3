//go:build gpu

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
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
	gpunvml "github.com/prismgpu/prism/pkg/gpu/nvml"
)

// The test plays a share's container by running the CUDA client through
// this test binary under containerName, which, as root, makes a mount
// namespace whose /dev/shm is the share's shared-memory directory (as the
// container runtime mounts it from the share's CDI edits), takes the
// container's UID and execs the client, keeping the PID.
const (
	containerName   = "prism-gpu-container"
	envContainerShm = "PRISM_GPU_CONTAINER_SHM"
	envContainerUID = "PRISM_GPU_CONTAINER_UID"
)

func init() {
	if filepath.Base(os.Args[0]) != containerName {
		return
	}
	err := enterContainer(os.Args[1:], os.Getenv(envContainerShm), os.Getenv(envContainerUID))
	fmt.Fprintf(os.Stderr, "%s: %v\n", containerName, err)
	os.Exit(launchFailCode)
}

// enterContainer execs argv with shm at /dev/shm ("": the host's) as uid;
// it returns only on failure.
func enterContainer(argv []string, shm, uid string) error {
	runtime.LockOSThread()
	if shm != "" {
		if err := enterShmNamespace(shm); err != nil {
			return err
		}
	}
	id, err := strconv.Atoi(uid)
	if err != nil {
		return fmt.Errorf("%s=%q: %w", envContainerUID, uid, err)
	}
	if id != 0 {
		if err := syscall.Setgroups(nil); err != nil {
			return err
		}
		if err := syscall.Setgid(id); err != nil {
			return err
		}
		if err := syscall.Setuid(id); err != nil {
			return err
		}
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, envContainerShm+"=") || strings.HasPrefix(kv, envContainerUID+"=")
	})
	return syscall.Exec(argv[0], argv, env)
}

const (
	gi = int64(1) << 30
	// lineTimeout bounds how long a client may take to print its line: a
	// new MPS server, or one of another UID replacing an idle one, starts
	// first, and the kernel takes about 2 s at 10 % of the threads.
	lineTimeout = 30 * time.Second
	// otherUIDWait is how long a client of another UID than a held
	// server's is given to start beside it in the same daemon, where MPS
	// documents that it waits.
	otherUIDWait = 5 * time.Second
	// ownShmWait is how long a client without its share's /dev/shm is
	// given before it counts as hung.
	ownShmWait = 15 * time.Second
	// exitTimeout bounds how long a client may take to exit once
	// released: its kernel after the hold takes milliseconds, unless its
	// server is gone under it.
	exitTimeout = 15 * time.Second
)

// The shares are on GPU 0. Share a is the one measured; b has other
// limits, so that a client served by the wrong daemon shows.
var (
	shareA = gpuv1alpha1.Share{ComputePercent: 40, MemoryBytes: 2 * gi}
	shareB = gpuv1alpha1.Share{ComputePercent: 70, MemoryBytes: 4 * gi}
)

// TestRealMPSPerShareDaemons runs two shares of GPU 0 the way the plugin
// does, each with a control daemon of its own started by a real Manager,
// and plays their containers with a CUDA client (hack/gpu-check/mps-client.cu)
// to see whether MPS behaves as the package's design assumes (doc.go):
//
//	PRISM_GPU_MPS_CLIENT=/path/prism-mps-client PRISM_GPU_OUT=/tmp/out \
//	go test -tags gpu -run TestRealMPSPerShareDaemons -v ./internal/plugin/mps/
//
// It needs root. Each numbered subtest records what it found in
// $PRISM_GPU_OUT/mps-shares/results.json, with the daemons' logs beside
// it, and fails only where the design plainly does not hold; the rest is
// for a person to read. The subtests run in order, on the same daemons.
func TestRealMPSPerShareDaemons(t *testing.T) {
	clientBin := os.Getenv("PRISM_GPU_MPS_CLIENT")
	if clientBin == "" {
		t.Skip("PRISM_GPU_MPS_CLIENT is not set: it names the CUDA client (hack/gpu-check/mps-client.cu, built by hack/gpu-check.sh)")
	}
	if os.Geteuid() != 0 {
		t.Skip("the daemons' and the clients' mount namespaces, and clients of other users, need root")
	}
	_, ctx := ktesting.NewTestContext(t)
	out := os.Getenv("PRISM_GPU_OUT")
	if out != "" {
		out = filepath.Join(out, "mps-shares")
	} else {
		out = t.TempDir()
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	r := &rig{top: t, ctx: ctx, out: out, res: &realMPSResults{}}
	defer func() {
		writeResults(t, out, r.res)
		if os.Getenv("PRISM_GPU_OUT") == "" {
			data, _ := json.MarshalIndent(r.res, "", "  ")
			t.Logf("results:\n%s", data)
		}
	}()

	r.nvml, r.res.GPU = gpu0(ctx, t)
	root, binary := controlDriverRoot(t)
	r.res.DriverRoot, r.res.ControlBinary = root, binary

	// Every user may reach the state directory and the client, as the
	// shares' clients run as the workloads' users.
	state := mpstest.OpenTempDir(t)
	mpstest.UnmountAtCleanup(t, state)
	r.bin = filepath.Join(mpstest.OpenTempDir(t), "prism-mps-client")
	copyExecutable(t, clientBin, r.bin)
	store, _, err := checkpoint.Open(ctx, state, checkpoint.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// No daemon outlives the test, whatever a subtest did to it.
	t.Cleanup(func() {
		for _, rec := range store.MPSDaemons() {
			if rec.PID > 0 {
				_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
			}
		}
		store.Close()
	})
	r.m = New(Options{DriverRoot: root, Root: filepath.Join(state, "mps"), Checkpoint: store})
	if err := r.m.Unavailable(); err != nil {
		t.Fatalf("MPS is unavailable: %v", err)
	}
	if err := r.m.Unbounded(); err != nil {
		r.res.Unbounded = err.Error()
	}

	// The unlimited rate, before any daemon runs: the client finds no
	// control pipe in an empty pipe directory, so it runs without MPS.
	r.none = container{env: r.withLibraries([]string{EnvPipeDirectory + "=" + mpstest.OpenTempDir(t)})}
	r.res.Unlimited = append(r.res.Unlimited, r.run(t, r.none))
	r.unlimited = r.res.Unlimited[0].Report
	if !r.unlimited.OK() {
		t.Fatalf("the CUDA client fails without MPS: %+v", r.res.Unlimited[0])
	}

	r.res.Shares = map[string]shareRecord{}
	for _, s := range []share{{name: "a", limits: shareA}, {name: "b", limits: shareB}} {
		s.key = "realgpu-" + s.name
		if err := r.m.Ensure(ctx, Daemon{Key: s.key, UUID: r.res.GPU, Limits: s.limits}); err != nil {
			t.Fatalf("starting share %s's daemon: %v", s.name, err)
		}
		s.rec = store.MPSDaemons()[s.key]
		r.res.Shares[s.name] = shareRecord{Key: s.key, ComputePercent: s.limits.ComputePercent, MemoryBytes: s.limits.MemoryBytes,
			PipeDir: s.rec.PipeDir, ShmDir: s.rec.ShmDir, DaemonPID: s.rec.PID}
		r.shares = append(r.shares, s)
	}

	for _, item := range []struct {
		name string
		run  func(*rig, *testing.T)
	}{
		{"1-several-daemons", (*rig).severalDaemons},
		{"2-limits-bind", (*rig).limitsBind},
		{"3-thread-limit", (*rig).threadLimit},
		{"4-memory-limit", (*rig).memoryLimit},
		{"5-two-uids", (*rig).twoUIDs},
		{"6-pids", (*rig).pids},
		{"5b-one-daemon-two-uids", (*rig).oneDaemonTwoUIDs},
		{"7-without-share-shm", (*rig).withoutShareShm},
		{"8-stop", (*rig).stop},
	} {
		t.Run(item.name, func(t *testing.T) { item.run(r, t) })
		// Written after each, so that a run cut short by its timeout,
		// which skips the deferred write, still leaves what it found.
		writeResults(t, out, r.res)
	}
}

// rig is what the subtests share: the Manager with the two shares'
// daemons, the client, and what earlier subtests found.
type rig struct {
	// top is the test's own t, which the clients held across subtests
	// belong to.
	top  *testing.T
	ctx  context.Context
	m    *Manager
	nvml nvml.Interface
	// bin is the client, out where the results go.
	bin, out string
	// shares are a and b, in that order.
	shares []share
	res    *realMPSResults
	// none is a container without MPS; unlimited is the client's first
	// run there.
	none      container
	unlimited *mpstest.GPUClientReport
	// asPrepared is share a's client with its share's environment.
	asPrepared mpstest.GPUClientReport
	// heldA and heldB hold their shares' servers as UIDs 1000 and 2000,
	// from 5-two-uids until 5b-one-daemon-two-uids.
	heldA, heldB *client
}

type share struct {
	name, key string
	limits    gpuv1alpha1.Share
	rec       checkpoint.MPSDaemon
}

// severalDaemons is item 1: a client of each share, as root, holds its
// server at once; each daemon lists its own client and not the other.
func (r *rig) severalDaemons(t *testing.T) {
	res := &severalDaemonsResult{Files: map[string][]dirEntry{}}
	r.res.SeveralDaemons = res
	got, want := map[string][]int{}, map[string][]int{}
	var held []*client
	for _, s := range r.shares {
		c := r.start(t, r.container(s, 0, nil), "--hold", "60")
		held = append(held, c)
		c.line(lineTimeout)
		if !c.run.Report.OK() {
			c.finish()
			t.Fatalf("share %s's client: %+v", s.name, *c.run)
		}
		want[s.name] = []int{c.run.Report.PID}
	}
	for i, s := range r.shares {
		d := daemonServing{Share: s.name, DaemonPID: s.rec.PID}
		d.Servers, d.QueryError = r.servers(s)
		for _, clients := range d.Servers {
			got[s.name] = append(got[s.name], clients...)
		}
		slices.Sort(got[s.name])
		for _, dir := range []string{s.rec.PipeDir, s.rec.ShmDir} {
			res.Files[s.name+"/"+filepath.Base(dir)] = listDir(dir)
		}
		held[i].finish()
		d.Client = held[i].run
		res.Daemons = append(res.Daemons, d)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("each share's daemon's clients, by get_server_list and get_client_list (-want +got):\n%s", diff)
	}
}

// limitsBind is item 2: share a's client with its limits in its
// environment as prepared, unset, raised and lowered, each allocating half
// and one and a half times the share's memory.
func (r *rig) limitsBind(t *testing.T) {
	a := r.shares[0]
	threads, pinned := EnvActiveThreadPercentage, EnvPinnedDeviceMemLimit
	below, above := shareA.MemoryBytes/2, shareA.MemoryBytes*3/2
	for _, tc := range []struct {
		name string
		edit func([]string) []string
		// check: the share's limits must hold the client. As prepared
		// is items 3's and 4's to check; lowered is only recorded.
		check bool
	}{
		{"as prepared", nil, false},
		{"limits unset", mpstest.UnsetEnv(threads, pinned), true},
		{"limits raised", mpstest.SetEnv(threads+"=100", pinned+"=0=81920M"), true},
		{"limits lowered", mpstest.SetEnv(threads+"=10", pinned+"=0=512M"), false},
	} {
		run := r.run(t, r.container(a, 0, tc.edit), "--alloc", fmt.Sprintf("%d,%d", below, above))
		lc := limitCase{Name: tc.name, Run: run}
		if rep := run.Report; rep.OK() {
			lc.BelowLimitAllocated = rep.AllocError(below) == ""
			e := rep.AllocError(above)
			lc.AboveLimitRefused = e != "" && e != "not tried"
			lc.RateOfUnlimited = rep.FlopsPerSecond / r.unlimited.FlopsPerSecond
		}
		r.res.LimitsBind = append(r.res.LimitsBind, lc)
		switch {
		case !run.Report.OK():
			t.Errorf("%s: the client failed: %+v", tc.name, run)
			continue
		case tc.name == "as prepared":
			r.asPrepared = *run.Report
		}
		if !tc.check {
			continue
		}
		want := limitCase{BelowLimitAllocated: true, AboveLimitRefused: true}
		got := limitCase{BelowLimitAllocated: lc.BelowLimitAllocated, AboveLimitRefused: lc.AboveLimitRefused}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: share a's memory limit of %d MiB, tried at %d and %d MiB (-want +got):\n%s",
				tc.name, shareA.MemoryBytes>>20, below>>20, above>>20, diff)
		}
		if lc.RateOfUnlimited >= 1 {
			t.Errorf("%s: the kernel ran at %.2f of its unlimited rate under share a's %d%% of the threads; want it slower",
				tc.name, lc.RateOfUnlimited, shareA.ComputePercent)
		}
	}
}

// threadLimit is item 3: the kernel's rate under each thread limit that
// ran, over the unlimited rate.
func (r *rig) threadLimit(t *testing.T) {
	// Once more unlimited, for how much the rate drifts.
	r.res.Unlimited = append(r.res.Unlimited, r.run(t, r.none))
	res := &threadLimitResult{UnlimitedSMCount: r.unlimited.SMCount}
	r.res.ThreadLimit = res
	for _, u := range r.res.Unlimited {
		if u.Report.OK() {
			res.UnlimitedFlopsPerSecond = append(res.UnlimitedFlopsPerSecond, u.Report.FlopsPerSecond)
		}
	}
	add := func(name string, percent int32, rep *mpstest.GPUClientReport) {
		if rep.OK() {
			res.Cases = append(res.Cases, threadCase{Name: name, LimitPercent: percent, SMCount: rep.SMCount,
				FlopsPerSecond: rep.FlopsPerSecond, RateOfUnlimited: rep.FlopsPerSecond / r.unlimited.FlopsPerSecond})
		}
	}
	add("a as prepared", shareA.ComputePercent, &r.asPrepared)
	for _, lc := range r.res.LimitsBind {
		if lc.Name == "limits lowered" {
			add("a lowered by its environment", 10, lc.Run.Report)
		}
	}
	if d := r.res.SeveralDaemons; d != nil && len(d.Daemons) == 2 {
		add("b as prepared", shareB.ComputePercent, d.Daemons[1].Client.Report)
	}
	if len(res.Cases) == 0 || res.Cases[0].Name != "a as prepared" {
		t.Fatal("share a's client as prepared did not run (see 2-limits-bind)")
	}
	a := res.Cases[0]
	t.Logf("at share a's %d%% of the threads the kernel ran at %.3f of its unlimited rate, on %d of %d SMs as CUDA reports them",
		a.LimitPercent, a.RateOfUnlimited, a.SMCount, res.UnlimitedSMCount)
	if a.RateOfUnlimited >= 1 {
		t.Errorf("share a's client ran its kernel at %.2f of the unlimited rate; want it slower", a.RateOfUnlimited)
	}
}

// memoryLimit is item 4: how share a's client as prepared fared with an
// allocation above its share's memory, and one below.
func (r *rig) memoryLimit(t *testing.T) {
	if !r.asPrepared.OK() || len(r.asPrepared.Allocs) != 2 {
		t.Fatal("share a's client as prepared did not run (see 2-limits-bind)")
	}
	below, above := r.asPrepared.Allocs[0], r.asPrepared.Allocs[1]
	r.res.MemoryLimit = &memoryLimitResult{LimitBytes: shareA.MemoryBytes,
		BelowBytes: below.Bytes, BelowError: below.Error,
		AboveBytes: above.Bytes, AboveError: above.Error, AboveMessage: above.Message,
		MemTotalBytes: r.asPrepared.MemTotalBytes, MemFreeBytes: r.asPrepared.MemFreeBytes, UnlimitedMemTotalBytes: r.unlimited.MemTotalBytes}
	t.Logf("above share a's limit, %d of %d MiB: %q (%s); cudaMemGetInfo under the limit: %d MiB total",
		above.Bytes>>20, shareA.MemoryBytes>>20, above.Error, above.Message, r.asPrepared.MemTotalBytes>>20)
	if above.Error == "" {
		t.Errorf("share a's client allocated %d MiB, above its share's %d MiB", above.Bytes>>20, shareA.MemoryBytes>>20)
	}
	if below.Error != "" {
		t.Errorf("share a's client could not allocate %d MiB, half its share: %s", below.Bytes>>20, below.Error)
	}
}

// twoUIDs is item 5: share a's client of UID 1000 holds its server while
// share b's of UID 2000 starts, and must not wait for it.
func (r *rig) twoUIDs(t *testing.T) {
	a, b := r.shares[0], r.shares[1]
	r.heldA = r.start(r.top, r.container(a, 1000, nil), "--hold", "60")
	if r.heldA.line(lineTimeout); !r.heldA.run.Report.OK() {
		t.Fatalf("share a's client of UID 1000: %+v", *r.heldA.run)
	}
	r.heldB = r.start(r.top, r.container(b, 2000, nil), "--hold", "60")
	r.heldB.line(lineTimeout)
	res := &twoUIDsResult{A: r.heldA.run, B: r.heldB.run, BesideA: r.heldB.run.Report.OK() && !r.heldA.exited()}
	r.res.TwoUIDs = res
	t.Logf("share b's client of UID 2000 printed its line %.1f s after its start, CUDA's initialisation %.1f s",
		r.heldB.run.LineSeconds, initSeconds(r.heldB.run.Report))
	if !res.BesideA {
		t.Errorf("share b's client of UID 2000 did not run while share a's of UID 1000 held its server: %+v", *r.heldB.run)
	}
}

// oneDaemonTwoUIDs is the end of item 5: a client of UID 2000 in share
// a's daemon while its client of UID 1000 holds the server, where MPS
// documents a wait, then the release of both held clients.
func (r *rig) oneDaemonTwoUIDs(t *testing.T) {
	if r.heldA == nil || !r.heldA.run.Report.OK() || r.heldA.exited() || r.res.TwoUIDs == nil {
		t.Fatal("share a's client of UID 1000 is not held (see 5-two-uids)")
	}
	c := r.start(t, r.container(r.shares[0], 2000, nil))
	res := &sameDaemonResult{}
	r.res.TwoUIDs.SameDaemon = res
	c.line(otherUIDWait)
	res.WaitedWhileHeld = c.run.TimedOut
	released := time.Now()
	r.heldA.finish()
	if res.WaitedWhileHeld {
		c.run.TimedOut = false
		c.line(lineTimeout)
		res.SecondsAfterRelease = time.Since(released).Seconds()
	}
	c.finish()
	res.Run = c.run
	r.heldB.finish()
	t.Logf("a client of UID 2000 in share a's daemon while UID 1000's held its server: waited %t; ran %t, %.1f s after the release",
		res.WaitedWhileHeld, c.run.Report.OK(), res.SecondsAfterRelease)
}

// withoutShareShm is item 7: share a's client with a /dev/shm of its own,
// as a container without the share's mount would have, then one with it.
func (r *rig) withoutShareShm(t *testing.T) {
	a := r.shares[0]
	own := mpstest.OpenTempDir(t)
	if err := os.Chmod(own, 0o1777); err != nil {
		t.Fatal(err)
	}
	ctr := r.container(a, 0, nil)
	ctr.shm = own
	c := r.start(t, ctr, "--hold", "60")
	c.line(ownShmWait)
	res := &ownShmResult{Run: c.run}
	r.res.WithoutShareShm = res
	switch rep := c.run.Report; {
	case c.run.TimedOut:
		res.Outcome = "hung"
	case !rep.OK():
		res.Outcome = "failed"
	default:
		servers, _ := r.servers(a)
		res.Outcome = "ran without MPS"
		for _, clients := range servers {
			if slices.Contains(clients, rep.PID) {
				res.Outcome = "connected"
			}
		}
	}
	res.ShmFiles = listDir(own)
	c.finish()
	after := r.run(t, r.container(a, 0, nil))
	res.After = &after
	t.Logf("a client of share a with a /dev/shm of its own: %s; a client with the share's right after ran: %t",
		res.Outcome, after.Report.OK())
}

// stop is item 8: each share's daemon stopped, share b's under a client
// that holds its server, as a pod that outlives its claim would leave it;
// none of their processes or directories may be left.
func (r *rig) stop(t *testing.T) {
	res := &stopResult{}
	r.res.Stop = res
	for _, s := range r.shares {
		sc := stopCase{Share: s.name}
		var c *client
		if s.name == "b" {
			c = r.start(t, r.container(s, 0, nil), "--hold", "60")
			c.line(lineTimeout)
			sc.ClientHeld = c.run.Report.OK()
		}
		pids := []int{s.rec.PID}
		servers, _ := r.servers(s)
		for server := range servers {
			pids = append(pids, server)
		}
		copyLogs(t, s.rec.LogDir, filepath.Join(r.out, "logs", s.name))
		started := time.Now()
		if err := r.m.Stop(r.ctx, s.key); err != nil {
			sc.Error = err.Error()
			t.Errorf("stopping share %s's daemon: %v", s.name, err)
		}
		sc.Seconds = time.Since(started).Seconds()
		if c != nil {
			c.finish()
			sc.Client = c.run
		}
		sc.Left = mpstest.Processes(func(p mpstest.Process) bool {
			return slices.Contains(pids, p.PID) || p.PipeDir == s.rec.PipeDir
		})
		_, err := os.Stat(filepath.Dir(s.rec.PipeDir))
		sc.DirLeft = err == nil
		res.Stops = append(res.Stops, sc)
		if diff := cmp.Diff([]mpstest.Process(nil), sc.Left); diff != "" {
			t.Errorf("share %s's daemon's processes running after its stop (-want +got):\n%s", s.name, diff)
		}
		if sc.DirLeft {
			t.Errorf("share %s's daemon's directory %s is left after its stop", s.name, filepath.Dir(s.rec.PipeDir))
		}
	}
}

// container is how a client is run: its whole environment, the host
// directory at its /dev/shm ("" for the host's), its user.
type container struct {
	share string
	env   []string
	shm   string
	uid   int
}

// container plays a container of share s run as uid: the environment of
// its CDI edits, changed by edit, with the daemon's host pipe directory
// in place of the container's, and the share's shared-memory directory
// at /dev/shm.
func (r *rig) container(s share, uid int, edit func([]string) []string) container {
	env := slices.Clone(ClientEdits(s.rec.PipeDir, s.rec.ShmDir, s.limits).Env)
	if edit != nil {
		env = edit(env)
	}
	env = mpstest.SetEnv(EnvPipeDirectory + "=" + s.rec.PipeDir)(env)
	return container{share: s.name, env: r.withLibraries(env), shm: s.rec.ShmDir, uid: uid}
}

// withLibraries adds where the driver's libraries are, which the
// container runtime would mount from the driver root.
func (r *rig) withLibraries(env []string) []string {
	if len(r.m.libDirs) == 0 {
		return env
	}
	return append(env, "LD_LIBRARY_PATH="+strings.Join(r.m.libDirs, ":"))
}

func initSeconds(c *mpstest.GPUClientReport) float64 {
	if c == nil {
		return 0
	}
	return c.InitSeconds
}

// clientRun is one run of the client, as recorded.
type clientRun struct {
	// Share is the share whose container it played; none for the
	// unlimited runs.
	Share string `json:"share,omitempty"`
	UID   int    `json:"uid"`
	// Env is its environment's CUDA_MPS_ variables.
	Env []string `json:"env"`
	mpstest.GPUClientOutcome
}

// client is a running client.
type client struct {
	run    *clientRun
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan string
	done   chan struct{}
	start  time.Time
	stderr bytes.Buffer
}

// start starts the client in ctr with args. It is killed when t ends, if
// it still runs.
func (r *rig) start(t *testing.T, ctr container, args ...string) *client {
	t.Helper()
	c := &client{lines: make(chan string, 4), done: make(chan struct{})}
	c.run = &clientRun{Share: ctr.share, UID: ctr.uid, GPUClientOutcome: mpstest.GPUClientOutcome{ExitCode: -1}}
	for _, kv := range ctr.env {
		if strings.HasPrefix(kv, "CUDA_MPS_") {
			c.run.Env = append(c.run.Env, kv)
		}
	}
	c.cmd = &exec.Cmd{Path: "/proc/self/exe", Args: append([]string{containerName, r.bin}, args...)}
	c.cmd.Env = append(slices.Clone(ctr.env), envContainerShm+"="+ctr.shm, envContainerUID+"="+strconv.Itoa(ctr.uid))
	c.cmd.Stderr = &c.stderr
	var err error
	if c.stdin, err = c.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	c.start = time.Now()
	if err := c.cmd.Start(); err != nil {
		t.Fatalf("starting the client: %v", err)
	}
	go func() {
		defer close(c.done)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			c.lines <- s.Text()
		}
		close(c.lines)
		// Only once its output is read.
		_ = c.cmd.Wait()
	}()
	// A failed test must not leave a client on the GPU.
	t.Cleanup(func() {
		if !c.exited() {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	})
	return c
}

// run runs the client in ctr to its end.
func (r *rig) run(t *testing.T, ctr container, args ...string) clientRun {
	t.Helper()
	c := r.start(t, ctr, args...)
	c.line(lineTimeout)
	c.finish()
	return *c.run
}

func (c *client) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// line waits up to timeout for the client's line, and records it, or
// that it timed out; a client that exits without one is finished.
func (c *client) line(timeout time.Duration) {
	select {
	case l, ok := <-c.lines:
		if !ok {
			c.finish()
			return
		}
		c.run.LineSeconds = time.Since(c.start).Seconds()
		c.run.Report = mpstest.ParseGPUClientLine(l)
	case <-time.After(timeout):
		c.run.TimedOut = true
	}
}

// finish releases a held client, reads what it says after its hold and
// waits up to exitTimeout for it to exit, then kills it. One that never
// printed its line is stuck in CUDA and killed at once.
func (c *client) finish() {
	_ = c.stdin.Close()
	if c.run.Report == nil {
		_ = c.cmd.Process.Kill()
	}
	giveUp := time.After(exitTimeout)
	for c.lines != nil {
		select {
		case l, ok := <-c.lines:
			if !ok {
				c.lines = nil
				continue
			}
			if after := mpstest.AfterHoldOf(l); after != "" {
				c.run.AfterHold = after
			}
		case <-giveUp:
			_ = c.cmd.Process.Kill()
			c.lines = nil
		}
	}
	<-c.done
	if c.cmd.ProcessState != nil {
		c.run.ExitCode = c.cmd.ProcessState.ExitCode()
	}
	c.run.Stderr = lastBytes(c.stderr.String(), 2000)
}

func lastBytes(s string, n int) string {
	return s[max(0, len(s)-n):]
}

// servers asks share s's daemon for its MPS servers and each one's
// clients, by PID.
func (r *rig) servers(s share) (map[int][]int, string) {
	out, err := r.m.control(r.ctx, s.rec, "get_server_list")
	if err != nil {
		return nil, err.Error()
	}
	servers := map[int][]int{}
	for _, field := range strings.Fields(out) {
		server, err := strconv.Atoi(field)
		if err != nil {
			return servers, fmt.Sprintf("get_server_list printed %q", out)
		}
		list, err := r.m.control(r.ctx, s.rec, "get_client_list "+field)
		if err != nil {
			return servers, err.Error()
		}
		clients := []int{}
		for _, f := range strings.Fields(list) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return servers, fmt.Sprintf("get_client_list %d printed %q", server, list)
			}
			clients = append(clients, pid)
		}
		servers[server] = clients
	}
	return servers, ""
}

// pids is item 6: while 5-two-uids's clients hold their shares' servers,
// what the servers run and have in their environments, which the usage
// sampler relies on, and which PIDs NVML lists.
func (r *rig) pids(t *testing.T) {
	if r.heldA == nil || r.heldB == nil || !r.heldA.run.Report.OK() || !r.heldB.run.Report.OK() {
		t.Fatal("no clients held (see 5-two-uids)")
	}
	res := &pidsResult{Roles: map[int]string{}}
	r.res.PIDs = res
	for _, s := range r.shares {
		held := map[string]*client{"a": r.heldA, "b": r.heldB}[s.name]
		res.Roles[s.rec.PID] = "daemon " + s.name
		res.Roles[held.run.Report.PID] = "client " + s.name
		servers, why := r.servers(s)
		if len(servers) == 0 {
			t.Errorf("share %s's daemon lists no server while its client holds one (query error: %q)", s.name, why)
		}
		for pid := range servers {
			res.Roles[pid] = "server " + s.name
			sp := serverProcess{Share: s.name, PID: pid, Argv0: argv0(pid), PipeDir: environValue(pid, EnvPipeDirectory)}
			res.Servers = append(res.Servers, sp)
			// The usage sampler tells a share's server by both.
			if filepath.Base(sp.Argv0) != mpstest.ServerBinary || sp.PipeDir != s.rec.PipeDir {
				t.Errorf("share %s's server %d runs %q with %s=%q; the usage sampler needs %s and %q",
					s.name, pid, sp.Argv0, EnvPipeDirectory, sp.PipeDir, mpstest.ServerBinary, s.rec.PipeDir)
			}
		}
	}
	dev, ret := r.nvml.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		res.NVMLErrors = append(res.NVMLErrors, "DeviceGetHandleByIndex: "+ret.Error())
		return
	}
	role := func(pid uint32) string {
		if r, ok := res.Roles[int(pid)]; ok {
			return r
		}
		return "other"
	}
	listed := func(name string, procs []nvml.ProcessInfo, ret nvml.Return) []nvmlProcess {
		if ret != nvml.SUCCESS {
			res.NVMLErrors = append(res.NVMLErrors, name+": "+ret.Error())
		}
		var out []nvmlProcess
		for _, p := range procs {
			mem := p.UsedGpuMemory
			out = append(out, nvmlProcess{PID: p.Pid, Role: role(p.Pid), MemoryBytes: &mem})
		}
		return out
	}
	procs, ret := dev.GetComputeRunningProcesses()
	res.ComputeRunning = listed("GetComputeRunningProcesses", procs, ret)
	procs, ret = dev.GetMPSComputeRunningProcesses()
	res.MPSComputeRunning = listed("GetMPSComputeRunningProcesses", procs, ret)
	samples, ret := dev.GetProcessUtilization(0)
	if ret != nvml.SUCCESS {
		res.NVMLErrors = append(res.NVMLErrors, "GetProcessUtilization: "+ret.Error())
	}
	for _, s := range samples {
		util := s.SmUtil
		res.ProcessUtilization = append(res.ProcessUtilization, nvmlProcess{PID: s.Pid, Role: role(s.Pid), SMUtilPercent: &util})
	}
	t.Logf("NVML's running compute processes while both clients hold their servers: %+v", res.ComputeRunning)
}

// argv0 is what pid runs, "" where that cannot be read.
func argv0(pid int) string {
	cmdline, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	first, _, _ := bytes.Cut(cmdline, []byte{0})
	return string(first)
}

// environValue is name's value in pid's environment, "" where it has
// none or it cannot be read.
func environValue(pid int, name string) string {
	environ, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	for _, kv := range strings.Split(string(environ), "\x00") {
		if v, ok := strings.CutPrefix(kv, name+"="); ok {
			return v
		}
	}
	return ""
}

// dirEntry is a file that MPS made in a pipe or shared-memory directory.
type dirEntry struct {
	Name string `json:"name"`
	Mode string `json:"mode"`
	Size int64  `json:"size"`
}

func listDir(dir string) []dirEntry {
	entries, _ := os.ReadDir(dir)
	out := []dirEntry{}
	for _, e := range entries {
		if info, err := e.Info(); err == nil {
			out = append(out, dirEntry{Name: e.Name(), Mode: info.Mode().String(), Size: info.Size()})
		}
	}
	return out
}

// copyLogs keeps a daemon's logs, which its stop removes.
func copyLogs(t *testing.T, from, to string) {
	t.Helper()
	if err := os.MkdirAll(to, 0o755); err != nil {
		t.Error(err)
		return
	}
	entries, _ := os.ReadDir(from)
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(from, e.Name()))
		if err == nil {
			err = os.WriteFile(filepath.Join(to, e.Name()), data, 0o644)
		}
		if err != nil {
			t.Errorf("keeping the daemon's log: %v", err)
		}
	}
}

func copyExecutable(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatalf("PRISM_GPU_MPS_CLIENT: %v", err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// gpu0 is NVML, initialised until the test ends, and GPU 0's UUID.
func gpu0(ctx context.Context, t *testing.T) (nvml.Interface, string) {
	t.Helper()
	lib, err := gpunvml.New(ctx, driverRoot())
	if err != nil {
		t.Fatal(err)
	}
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("NVML Init: %v", ret)
	}
	t.Cleanup(func() { _ = lib.Shutdown() })
	dev, ret := lib.DeviceGetHandleByIndex(0)
	if ret != nvml.SUCCESS {
		t.Fatalf("NVML has no GPU 0: %v", ret)
	}
	uuid, ret := dev.GetUUID()
	if ret != nvml.SUCCESS {
		t.Fatalf("GPU 0's UUID: %v", ret)
	}
	return lib, uuid
}

// driverRoot is where the NVIDIA driver is installed: PRISM_DRIVER_ROOT,
// which hack/gpu-check.sh finds from NVML's library, or /.
func driverRoot() string {
	if root := os.Getenv("PRISM_DRIVER_ROOT"); root != "" {
		return root
	}
	return "/"
}

// controlDriverRoot is the driver root to give the Manager, and the
// control binary it will run. The Manager looks in <root>/usr/bin; where
// the driver keeps the binary elsewhere (GKE's /usr/local/nvidia/bin) or
// only on PATH, the root is made of links to it, its server and libcuda.
func controlDriverRoot(t *testing.T) (root, binary string) {
	t.Helper()
	root = driverRoot()
	if binary = filepath.Join(root, "usr", "bin", ControlBinary); isFile(binary) {
		return root, binary
	}
	if binary = filepath.Join(root, "bin", ControlBinary); !isFile(binary) {
		var err error
		if binary, err = exec.LookPath(ControlBinary); err != nil {
			t.Fatalf("no %s in the driver root %s nor on PATH", ControlBinary, root)
		}
	}
	links := mpstest.OpenTempDir(t)
	bin := filepath.Join(links, "usr", "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{ControlBinary, mpstest.ServerBinary} {
		if err := os.Symlink(filepath.Join(filepath.Dir(binary), name), filepath.Join(bin, name)); err != nil {
			t.Fatal(err)
		}
	}
	for _, dir := range append(slices.Clone(libraryDirs), "lib64", "lib") {
		if isFile(filepath.Join(root, dir, "libcuda.so.1")) {
			if err := os.Symlink(filepath.Join(root, dir), filepath.Join(links, "usr", "lib64")); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	return links, binary
}

func isFile(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir()
}

// realMPSResults is results.json: each item of the subtests, nil where it
// did not run.
type realMPSResults struct {
	GPU           string `json:"gpu"`
	DriverRoot    string `json:"driver_root"`
	ControlBinary string `json:"control_binary"`
	// Unbounded says why the daemons' directories are not tmpfs mounts of
	// their own; empty where they are.
	Unbounded string                 `json:"unbounded,omitempty"`
	Shares    map[string]shareRecord `json:"shares"`
	// Unlimited are the client's runs without MPS: before any daemon,
	// and after share a's limit cases.
	Unlimited       []clientRun           `json:"unlimited"`
	SeveralDaemons  *severalDaemonsResult `json:"several_daemons"`
	LimitsBind      []limitCase           `json:"limits_bind"`
	ThreadLimit     *threadLimitResult    `json:"thread_limit"`
	MemoryLimit     *memoryLimitResult    `json:"memory_limit"`
	TwoUIDs         *twoUIDsResult        `json:"two_uids"`
	PIDs            *pidsResult           `json:"pids"`
	WithoutShareShm *ownShmResult         `json:"without_share_shm"`
	Stop            *stopResult           `json:"stop"`
}

type shareRecord struct {
	Key            string `json:"key"`
	ComputePercent int32  `json:"compute_percent"`
	MemoryBytes    int64  `json:"memory_bytes"`
	PipeDir        string `json:"pipe_dir"`
	ShmDir         string `json:"shm_dir"`
	DaemonPID      int    `json:"daemon_pid"`
}

// severalDaemonsResult is item 1: a client of each share held at once.
type severalDaemonsResult struct {
	Daemons []daemonServing `json:"daemons"`
	// Files are what each share's pipe and shm directories held then.
	Files map[string][]dirEntry `json:"files"`
}

type daemonServing struct {
	Share     string `json:"share"`
	DaemonPID int    `json:"daemon_pid"`
	// Servers maps each of the daemon's MPS servers to its clients
	// (get_server_list, get_client_list).
	Servers    map[int][]int `json:"servers"`
	QueryError string        `json:"query_error,omitempty"`
	Client     *clientRun    `json:"client"`
}

// limitCase is one run of item 2: share a's client with its limits in its
// environment as prepared, unset, raised or lowered, allocating half and
// one and a half times the share's memory.
type limitCase struct {
	Name                string    `json:"name"`
	Run                 clientRun `json:"run"`
	BelowLimitAllocated bool      `json:"below_limit_allocated"`
	AboveLimitRefused   bool      `json:"above_limit_refused"`
	// RateOfUnlimited is the kernel's rate over the unlimited client's.
	RateOfUnlimited float64 `json:"rate_of_unlimited"`
}

// threadLimitResult is item 3.
type threadLimitResult struct {
	UnlimitedFlopsPerSecond []float64    `json:"unlimited_flops_per_second"`
	UnlimitedSMCount        int          `json:"unlimited_sm_count"`
	Cases                   []threadCase `json:"cases"`
}

type threadCase struct {
	Name         string `json:"name"`
	LimitPercent int32  `json:"limit_percent"`
	// SMCount is what CUDA told the client.
	SMCount         int     `json:"sm_count"`
	FlopsPerSecond  float64 `json:"flops_per_second"`
	RateOfUnlimited float64 `json:"rate_of_unlimited"`
}

// memoryLimitResult is item 4, from share a's client as prepared.
type memoryLimitResult struct {
	LimitBytes   int64  `json:"limit_bytes"`
	BelowBytes   int64  `json:"below_bytes"`
	BelowError   string `json:"below_error,omitempty"`
	AboveBytes   int64  `json:"above_bytes"`
	AboveError   string `json:"above_error"`
	AboveMessage string `json:"above_message"`
	// What cudaMemGetInfo told the client, and the unlimited one.
	MemTotalBytes          int64 `json:"mem_total_bytes"`
	MemFreeBytes           int64 `json:"mem_free_bytes"`
	UnlimitedMemTotalBytes int64 `json:"unlimited_mem_total_bytes"`
}

// twoUIDsResult is item 5: share a's client of UID 1000 holds its server
// while share b's of UID 2000 starts.
type twoUIDsResult struct {
	A *clientRun `json:"a_uid_1000"`
	B *clientRun `json:"b_uid_2000"`
	// BesideA: b's client ran while a's held its server.
	BesideA    bool              `json:"b_ran_beside_a"`
	SameDaemon *sameDaemonResult `json:"same_daemon_other_uid"`
}

// sameDaemonResult: a client of UID 2000 in share a's daemon while its
// client of UID 1000 holds the server, where MPS documents a wait.
type sameDaemonResult struct {
	Run *clientRun `json:"run"`
	// WaitedWhileHeld: no line within otherUIDWait.
	WaitedWhileHeld bool `json:"waited_while_held"`
	// SecondsAfterRelease is how long after a's release it printed.
	SecondsAfterRelease float64 `json:"seconds_after_release,omitempty"`
}

// pidsResult is item 6, taken while item 5's clients hold their servers.
type pidsResult struct {
	// Roles names the test's PIDs: "client a", "server a", "daemon a".
	Roles   map[int]string  `json:"roles"`
	Servers []serverProcess `json:"servers"`
	// What NVML lists; each PID's role is "other" where it is none of
	// the test's.
	ComputeRunning     []nvmlProcess `json:"compute_running"`
	MPSComputeRunning  []nvmlProcess `json:"mps_compute_running"`
	ProcessUtilization []nvmlProcess `json:"process_utilization"`
	NVMLErrors         []string      `json:"nvml_errors,omitempty"`
}

// serverProcess is an MPS server: what it runs and the pipe directory in
// its environment.
type serverProcess struct {
	Share   string `json:"share"`
	PID     int    `json:"pid"`
	Argv0   string `json:"argv0"`
	PipeDir string `json:"pipe_dir"`
}

type nvmlProcess struct {
	PID           uint32  `json:"pid"`
	Role          string  `json:"role"`
	MemoryBytes   *uint64 `json:"memory_bytes,omitempty"`
	SMUtilPercent *uint32 `json:"sm_util_pct,omitempty"`
}

// ownShmResult is item 7: share a's client with a /dev/shm of its own.
type ownShmResult struct {
	Run *clientRun `json:"run"`
	// Outcome: "connected" (share a's server lists it), "ran without
	// MPS", "failed" (CUDA did not initialise or a call failed) or "hung"
	// (no line within ownShmWait).
	Outcome string `json:"outcome"`
	// ShmFiles is what its own /dev/shm held.
	ShmFiles []dirEntry `json:"shm_files"`
	// After is a client with the share's /dev/shm right after it.
	After *clientRun `json:"after"`
}

// stopResult is item 8.
type stopResult struct {
	Stops []stopCase `json:"stops"`
}

type stopCase struct {
	Share string `json:"share"`
	// ClientHeld: a client held the daemon's server during the stop;
	// Client is that client, AfterHold what its next kernel got.
	ClientHeld bool       `json:"client_held"`
	Client     *clientRun `json:"client,omitempty"`
	Seconds    float64    `json:"seconds"`
	Error      string     `json:"error,omitempty"`
	// Left are the daemon's processes still running, DirLeft that its
	// directory is still there.
	Left    []mpstest.Process `json:"left"`
	DirLeft bool              `json:"dir_left"`
}

// writeResults writes results.json into out.
func writeResults(t *testing.T, out string, res *realMPSResults) {
	data, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		t.Errorf("encoding the results: %v", err)
		return
	}
	path := filepath.Join(out, "results.json")
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		t.Errorf("recording the results: %v", err)
	}
}
