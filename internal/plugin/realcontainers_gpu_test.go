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

package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

const (
	// ctrLineTimeout bounds how long a container may take to print the
	// client's line: runc and the spec's hooks, CUDA's start, an MPS
	// server's start for a share, and the kernel.
	ctrLineTimeout = 60 * time.Second
	// ctrExitTimeout bounds how long a container may take to exit once
	// released.
	ctrExitTimeout = 15 * time.Second
	// profiledTimeout bounds the profiled container's run under ncu.
	profiledTimeout = 90 * time.Second
	// attachSeconds is how long share b's client may take to initialise
	// CUDA while share a's holds its server: it would wait until a's
	// release (60 s) if they shared a daemon, as clients of two UIDs do.
	attachSeconds = 5
	// pairSeconds is how long the pair's kernel would take alone.
	pairSeconds = 3.0
	// memoryTolerance is how far the memory CUDA reports in a container
	// of the whole GPU may be from NVML's.
	memoryTolerance = 0.03
	gib             = int64(1) << 30
)

// The shares of 2-mps-shares: a counts and is capped at 40 % of the SMs,
// with 2 GiB; b counts 20 % without a cap, with 4 GiB.
const (
	shareAPercent = 40
	shareAMemory  = 2 * gib
	shareBMemory  = 4 * gib
)

// TestRealContainersFromPrismsCDISpec prepares claims of GPU 0 through a
// Driver on the real driver (NVML's inventory, nvcdi's edits, an MPS
// control daemon per share) and runs their containers with runc, each
// from a bundle of runc's defaults into which the CDI library injects the
// devices that the prepare returned, from the spec it wrote, as a runtime
// does. A container's root file system holds prism-mps-client
// (hack/gpu-check/mps-client.cu) and the libraries ldd lists for it and
// for the driver's libcuda, but none of NVIDIA's: CUDA starts only if the
// spec's mounts and hooks (nvidia-cdi-hook) bring libcuda.
//
//  1. whole-gpu: a claim of the whole GPU, its container as root: the
//     client sees every SM and the GPU's memory.
//  2. mps-shares: two shares, each with a daemon of its own; the
//     container of a, as UID 1000, unsets its CUDA_MPS_* variables, and
//     that of b, as UID 2000, raises them: a still sees about 40 % of the
//     SMs and is refused 3 GiB, b sees every SM (no cap asked) and is
//     refused 5 GiB, and b starts at once while a holds its server.
//  3. time-sliced-pair: two containers of one whole-GPU claim run the
//     kernel at once, each slower than alone.
//  4. profiled: a claim that asks for ncu; its container runs under the
//     preload shim and the real ncu, and the report becomes a
//     WorkloadProfile with a bound type. Its root file system has the
//     host's /usr (and /bin, /lib...) through overlays, for ncu's launcher
//     and libraries.
//  5. nothing-left: after every unprepare, no MPS process, MPS directory,
//     CDI spec or container is left.
//
// It needs root. Environment:
//
//	PRISM_GPU_MPS_CLIENT  prism-mps-client, built by hack/gpu-check.sh (required)
//	NCU_DIR               the Nsight Compute install holding ncu (required, for 4)
//	PRISM_DRIVER_ROOT     the driver root (default /)
//	PRISM_NVML_LIBRARY    libnvidia-ml.so.1 for nvcdi (default: the loader's)
//	PRISM_RUNC            runc (default: runc on PATH)
//	PRISM_GPU_CDI_HOOK    nvidia-cdi-hook, which the specs' hooks name
//	                      (default cdi.DefaultNVIDIACDIHookPath)
//	PRISM_GPU_OUT         records go to $PRISM_GPU_OUT/containers: results.json,
//	                      each claim's spec, each container's config.json,
//	                      output and runc log (default: discarded after the test)
//
// hack/gpu-check.sh sets them all in its containers step:
//
//	PRISM_GPU_MPS_CLIENT=/path/prism-mps-client NCU_DIR=/opt/nvidia/nsight-compute/<version> \
//	go test -tags gpu -run TestRealContainersFromPrismsCDISpec -v ./internal/plugin/
//
// The subtests run in order, on one Driver; 3 takes its kernel's size
// from 1.
func TestRealContainersFromPrismsCDISpec(t *testing.T) {
	env := readContainersEnv(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &containersRig{env: env, out: filepath.Join(env.out, "containers")}
	for _, dir := range []string{"logs", "specs", "bundles"} {
		if err := os.MkdirAll(filepath.Join(r.out, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	r.res = &containersResults{DriverRoot: env.driverRoot, NVMLLibrary: env.nvmlLibrary, Runc: env.runc, CDIHook: env.hook, NCUDir: env.ncuDir}
	defer r.write(t)

	// Every user may reach the state directory: the shares' MPS servers
	// run as the containers' users.
	r.state = mpstest.OpenTempDir(t)
	mpstest.UnmountAtCleanup(t, r.state)
	r.api = profileAPI(t, interceptor.Funcs{})
	r.d = newRealDriver(ctx, t, env, r.state, r.api)
	r.d.state.profiler.start(ctx)
	if err := r.d.state.shares.daemons.Unavailable(); err != nil {
		t.Fatalf("MPS is unavailable with the driver root %s: %v", env.driverRoot, err)
	}
	g, ok := r.d.state.gpus.get("gpu-0")
	if !ok {
		t.Fatal("the NVML inventory has no gpu-0, the claims' device")
	}
	r.gpu = g
	r.res.GPU = gpuRecord{Name: g.Name(), UUID: g.UUID, Product: g.ProductName, SMs: g.MultiprocessorCount, MemoryBytes: g.MemoryBytes}
	r.runc = newRuncRig(t, env.runc, filepath.Join(r.state, "cdi"), r.out, env.client, driverLibcuda(t, env.driverRoot))
	r.res.RuncVersion, r.res.Rootfs, r.res.NoPivot = r.runc.version, r.runc.files, r.runc.noPivot
	// No container or daemon outlives the test, whatever a subtest did.
	// A run cut short by -test.timeout skips the cleanups, and the
	// daemons, in sessions of their own, would outlive it into
	// hack/gpu-check.sh's later steps: they are killed before.
	t.Cleanup(r.killAll)
	if deadline, ok := t.Deadline(); ok {
		defer time.AfterFunc(time.Until(deadline)-10*time.Second, r.killAll).Stop()
	}

	r.subtest(t, "1-whole-gpu", r.wholeGPU)
	r.subtest(t, "2-mps-shares", r.mpsShares)
	r.subtest(t, "3-time-sliced-pair", r.timeSlicedPair)
	r.subtest(t, "4-profiled", r.profiled)
	r.subtest(t, "5-nothing-left", r.nothingLeft)
}

// subtest runs one and records the results after it, so that a run cut
// short by its timeout, which skips the deferred write, still leaves what
// it found.
func (r *containersRig) subtest(t *testing.T, name string, f func(*testing.T)) {
	t.Run(name, f)
	r.write(t)
}

// containersEnv is what the test reads from its environment.
type containersEnv struct {
	driverRoot, nvmlLibrary, client, ncuDir, runc, hook, out string
}

func readContainersEnv(t *testing.T) containersEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: runc, the MPS daemons' mount namespaces and containers of other users")
	}
	e := containersEnv{
		driverRoot:  os.Getenv("PRISM_DRIVER_ROOT"),
		nvmlLibrary: os.Getenv("PRISM_NVML_LIBRARY"),
		client:      os.Getenv("PRISM_GPU_MPS_CLIENT"),
		ncuDir:      os.Getenv("NCU_DIR"),
		runc:        os.Getenv("PRISM_RUNC"),
		hook:        os.Getenv("PRISM_GPU_CDI_HOOK"),
		out:         os.Getenv("PRISM_GPU_OUT"),
	}
	if e.driverRoot == "" {
		e.driverRoot = "/"
	}
	if e.client == "" {
		t.Fatal("PRISM_GPU_MPS_CLIENT is not set: it names prism-mps-client (hack/gpu-check/mps-client.cu), which hack/gpu-check.sh builds")
	}
	if e.ncuDir == "" {
		t.Fatal("NCU_DIR is not set: it names the Nsight Compute install holding ncu, for the profiled container")
	}
	if e.runc == "" {
		p, err := exec.LookPath("runc")
		if err != nil {
			t.Fatal("PRISM_RUNC is not set and there is no runc on PATH: hack/gpu-check.sh --build-tests puts one beside the test binaries")
		}
		e.runc = p
	}
	if e.hook == "" {
		e.hook = cdi.DefaultNVIDIACDIHookPath
	}
	// The specs name the hook, which runc runs by its absolute path.
	if p, err := filepath.Abs(e.hook); err == nil {
		e.hook = p
	}
	for what, p := range map[string]string{"PRISM_GPU_MPS_CLIENT": e.client, "runc (PRISM_RUNC)": e.runc,
		"nvidia-cdi-hook (PRISM_GPU_CDI_HOOK), which the CDI specs' hooks run and hack/gpu-check.sh --build-tests builds": e.hook,
		"ncu in NCU_DIR": filepath.Join(e.ncuDir, "ncu")} {
		if info, err := os.Stat(p); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
			t.Fatalf("%s: %s is not an executable file (%v)", what, p, err)
		}
	}
	if e.out == "" {
		e.out = t.TempDir()
		t.Logf("PRISM_GPU_OUT is not set; records go to %s and are discarded", e.out)
	}
	return e
}

// newRealDriver is a Driver on the host's driver, as the plugin's main
// makes one (nvmlGPUs), short of the kubelet: the NVML inventory, nvcdi's
// edits with the hook at env.hook, MPS from the driver root, and
// profiling that publishes to api.
func newRealDriver(ctx context.Context, t *testing.T, env containersEnv, state string, api client.Client) *Driver {
	t.Helper()
	lib, err := nvml.New(ctx, env.driverRoot)
	if err != nil {
		t.Fatal(err)
	}
	sysfs, _ := os.DirFS("/sys").(fs.ReadLinkFS)
	roots := cdi.Roots{DriverRoot: env.driverRoot}
	source, err := cdi.NewNVMLSource(ctx, cdi.NVMLOptions{Roots: roots, NVMLLibraryPath: env.nvmlLibrary, NVIDIACDIHookPath: env.hook})
	if err != nil {
		t.Fatalf("NewNVMLSource: %v", err)
	}
	writer, err := cdi.NewWriter(cdi.Options{Root: filepath.Join(state, "cdi"), Source: source, Roots: roots})
	if err != nil {
		t.Fatal(err)
	}
	shim, err := profiling.BuildShim(ctx, filepath.Join(state, "shim"))
	if err != nil {
		t.Fatalf("building the profiling shim: %v", err)
	}
	d, err := newDriver(ctx, Config{
		NodeName:      testNode,
		KubeClient:    fake.NewClientset(),
		Inventory:     nvml.NewNVMLInventory(lib, sysfs),
		CDI:           writer,
		StateDir:      state,
		MPSDriverRoot: env.driverRoot,
		Profiling: &ProfilingConfig{
			Options:   profiling.Options{StateDir: state, NCUDir: env.ncuDir, ShimPath: shim},
			Publisher: profiling.NewPublisher(profilingtest.WorkloadProfiles(api)),
			Retention: 5,
		},
	})
	if err != nil {
		t.Fatalf("starting the driver on the real GPUs: %v", err)
	}
	d.pool.publisher = &recordingPublisher{}
	t.Cleanup(d.broadcast.Shutdown)
	t.Cleanup(d.state.checkpoint.Close)
	return d
}

// containersRig is what the subtests share.
type containersRig struct {
	env   containersEnv
	d     *Driver
	api   client.Client
	gpu   gpu.Device
	runc  *runcRig
	state string
	out   string
	res   *containersResults
	// alone is the client alone on the whole GPU, from 1.
	alone *mpstest.GPUClientReport
	// mpsPIDs are the MPS processes seen while the shares ran: their
	// daemons and servers.
	mpsPIDs []int
}

// killAll kills the containers in runc's state directory and the MPS
// processes that serve the state directory.
func (r *containersRig) killAll() {
	out, _ := exec.Command(r.runc.runc, "--root", r.runc.root, "list", "--quiet").Output()
	for _, id := range strings.Fields(string(out)) {
		_ = exec.Command(r.runc.runc, "--root", r.runc.root, "kill", id, "KILL").Run()
		_ = exec.Command(r.runc.runc, "--root", r.runc.root, "delete", "--force", id).Run()
	}
	for _, p := range r.mpsProcesses(nil) {
		// A daemon leads a session of its own, with its servers.
		_ = syscall.Kill(-p.PID, syscall.SIGKILL)
		_ = syscall.Kill(p.PID, syscall.SIGKILL)
	}
}

// prepare prepares claim and returns its CDI device IDs; its spec is
// recorded. Should the subtest end with the claim still prepared, it is
// unprepared then.
func (r *containersRig) prepare(t *testing.T, claim *resourceapi.ResourceClaim) []string {
	t.Helper()
	uid := string(claim.UID)
	res := prepare(t, r.d, claim)[claim.UID]
	if res.Err != nil {
		t.Fatalf("prepare %s: %v", uid, res.Err)
	}
	t.Cleanup(func() {
		if _, ok := r.d.state.checkpoint.Get(uid); ok {
			_ = unprepareOne(context.Background(), r.d, uid)
		}
	})
	var ids []string
	for _, dev := range res.Devices {
		ids = append(ids, dev.CDIDeviceIDs...)
	}
	spec := filepath.Join(r.state, "cdi", cdi.SpecFileName(uid))
	if data, err := os.ReadFile(spec); err != nil {
		t.Errorf("the spec of claim %s: %v", uid, err)
	} else {
		writeFile(t, filepath.Join(r.out, "specs", uid+".json"), data)
	}
	if len(ids) == 0 {
		t.Fatalf("prepare %s returned no CDI device", uid)
	}
	return ids
}

func (r *containersRig) unprepare(t *testing.T, uid string) {
	t.Helper()
	if err := unprepareOne(context.Background(), r.d, uid); err != nil {
		t.Errorf("unprepare %s: %v", uid, err)
	}
}

// wholeGPU is 1: the client alone in a container of the whole GPU.
func (r *containersRig) wholeGPU(t *testing.T) {
	const uid = "ctr-whole"
	ids := r.prepare(t, allocatedClaim(uid, []string{r.gpu.Name()}))
	c := r.runc.start(t, ctrSpec{name: "whole", claim: uid, ids: ids})
	c.line(ctrLineTimeout)
	c.finish()
	r.res.Whole = c.run
	r.unprepare(t, uid)
	rep := c.run.Report
	if c.run.ExitCode != 0 || !rep.OK() {
		t.Fatalf("the client in a container of the whole GPU: exit %d, report %+v; stderr:\n%s", c.run.ExitCode, rep, c.run.Stderr)
	}
	r.alone = rep
	if len(c.run.DriverLibraries) == 0 {
		t.Errorf("the container's spec mounts no libcuda or libnvidia library; its mounts: %d", c.run.Mounts)
	}
	if rep.SMCount != r.gpu.MultiprocessorCount {
		t.Errorf("the client saw %d SMs; NVML counts %d", rep.SMCount, r.gpu.MultiprocessorCount)
	}
	if off := float64(rep.MemTotalBytes)/float64(r.gpu.MemoryBytes) - 1; math.Abs(off) > memoryTolerance {
		t.Errorf("the client saw %d bytes of memory, %+.1f%% off NVML's %d", rep.MemTotalBytes, 100*off, r.gpu.MemoryBytes)
	}
	t.Logf("alone on the whole GPU: %d SMs, %d MiB, %.1f TFLOP/s in %.3f s of %d launches",
		rep.SMCount, rep.MemTotalBytes>>20, rep.FlopsPerSecond/1e12, rep.KernelSeconds, rep.Launches)
}

// mpsShares is 2: two shares of GPU 0, each with a daemon of its own, whose
// workloads try to escape their limits through their environments.
func (r *containersRig) mpsShares(t *testing.T) {
	const uidA, uidB = "ctr-share-a", "ctr-share-b"
	idsA := r.prepare(t, cappedShare(uidA, shareAPercent, shareAPercent, "2Gi"))
	idsB := r.prepare(t, computeShare(uidB, 20, "4Gi"))
	res := &sharesResult{Daemons: map[string]daemonRecord{}}
	r.res.Shares = res
	daemons := r.d.state.checkpoint.MPSDaemons()
	for _, uid := range []string{uidA, uidB} {
		rec := daemons[shareDaemon(uid)]
		res.Daemons[uid] = daemonRecord{PID: rec.PID, PipeDir: rec.PipeDir, ShmDir: rec.ShmDir, Limits: rec.Limits.String()}
		if rec.PID == 0 {
			t.Fatalf("claim %s's share has no daemon of its own: %v", uid, daemons)
		}
		r.mpsPIDs = append(r.mpsPIDs, rec.PID)
	}
	if res.Daemons[uidA].PipeDir == res.Daemons[uidB].PipeDir {
		t.Fatalf("the shares' daemons share a pipe directory: %+v", res.Daemons)
	}

	// a unsets its limits and holds its server; b raises its limits and
	// must start beside it.
	unsetMPS := func(s *specs.Spec) {
		s.Process.Env = slices.DeleteFunc(s.Process.Env, func(kv string) bool { return strings.HasPrefix(kv, "CUDA_MPS_") })
	}
	raiseMPS := func(s *specs.Spec) {
		s.Process.Env = mpstest.SetEnv(mps.EnvActiveThreadPercentage+"=100", mps.EnvPinnedDeviceMemLimit+"=0=80G")(s.Process.Env)
	}
	a := r.runc.start(t, ctrSpec{name: "share-a", claim: uidA, uid: 1000, ids: idsA, edit: unsetMPS,
		args: []string{"--alloc", fmt.Sprintf("%d,%d", 1*gib, 3*gib), "--hold", "60"}})
	a.line(ctrLineTimeout)
	res.A = a.run
	if !a.run.Report.OK() {
		a.finish()
		t.Fatalf("share a's client (UID 1000): %+v; stderr:\n%s", a.run.Report, a.run.Stderr)
	}
	b := r.runc.start(t, ctrSpec{name: "share-b", claim: uidB, uid: 2000, ids: idsB, edit: raiseMPS,
		args: []string{"--alloc", strconv.FormatInt(5*gib, 10), "--hold", "60"}})
	b.line(ctrLineTimeout)
	res.B = b.run
	res.BBesideA = b.run.Report.OK() && !a.ended.Load()
	// While both hold their servers: which server serves which pipe
	// directory.
	res.Servers = map[string][]int{}
	for _, p := range r.mpsProcesses(nil) {
		r.mpsPIDs = append(r.mpsPIDs, p.PID)
		if filepath.Base(p.Argv0) != mpstest.ServerBinary {
			continue
		}
		for uid, rec := range res.Daemons {
			if p.PipeDir == rec.PipeDir {
				res.Servers[uid] = append(res.Servers[uid], p.PID)
			}
		}
	}
	b.finish()
	a.finish()
	for _, uid := range []string{uidA, uidB} {
		if rec, ok := daemons[shareDaemon(uid)]; ok {
			copyDir(t, rec.LogDir, filepath.Join(r.out, "logs", "mps-"+uid))
		}
	}
	r.unprepare(t, uidA)
	r.unprepare(t, uidB)

	n := r.gpu.MultiprocessorCount
	for _, s := range []struct {
		name string
		run  *ctrRun
	}{{"a", a.run}, {"b", b.run}} {
		if s.run.ExitCode != 0 || !s.run.Report.OK() || s.run.AfterHold != "cudaSuccess" {
			t.Errorf("share %s's client: exit %d, after its hold %q, report %+v; stderr:\n%s",
				s.name, s.run.ExitCode, s.run.AfterHold, s.run.Report, s.run.Stderr)
		}
		if len(res.Servers["ctr-share-"+s.name]) == 0 {
			t.Errorf("no MPS server with share %s's pipe directory ran while its client held it; servers by share: %v", s.name, res.Servers)
		}
	}
	// What a's workload removed: the limits its spec gave it.
	if want := fmt.Sprintf("%s=%d", mps.EnvActiveThreadPercentage, shareAPercent); !slices.Contains(a.run.InjectedEnv, want) {
		t.Errorf("share a's spec did not give its container %s: %v", want, a.run.InjectedEnv)
	}
	if ra := a.run.Report; ra.OK() {
		// 40 % of 132 SMs is 52.8: the H200 gave 52.
		floor, round := n*shareAPercent/100, (n*shareAPercent+50)/100
		switch {
		case abs(ra.SMCount-floor) <= 2:
			t.Logf("share a sees %d of %d SMs, within 2 of %d %% rounded down (%d)", ra.SMCount, n, shareAPercent, floor)
		case abs(ra.SMCount-round) <= 2:
			t.Logf("share a sees %d of %d SMs, within 2 of %d %% rounded (%d)", ra.SMCount, n, shareAPercent, round)
		default:
			t.Errorf("share a, capped at %d %% with its CUDA_MPS_ variables unset, sees %d of %d SMs; want within 2 of %d or %d",
				shareAPercent, ra.SMCount, n, floor, round)
		}
		if e := ra.AllocError(1 * gib); e != "" {
			t.Errorf("share a (%d GiB) could not allocate 1 GiB: %s", shareAMemory/gib, e)
		}
		if e := ra.AllocError(3 * gib); e != "cudaErrorMemoryAllocation" {
			t.Errorf("share a (%d GiB) allocating 3 GiB with its CUDA_MPS_ variables unset: %q, want cudaErrorMemoryAllocation", shareAMemory/gib, e)
		}
	}
	if rb := b.run.Report; rb.OK() {
		if !res.BBesideA {
			t.Errorf("share b's client (UID 2000) did not run while share a's (UID 1000) held its server")
		}
		if rb.InitSeconds >= attachSeconds {
			t.Errorf("share b's client took %.1f s to start CUDA while share a's held its server; want under %d s: it waited, as a client of another UID in the same daemon does",
				rb.InitSeconds, attachSeconds)
		}
		if rb.SMCount != n {
			t.Errorf("share b, which asks for no cap, sees %d of %d SMs", rb.SMCount, n)
		}
		if e := rb.AllocError(5 * gib); e == "" {
			t.Errorf("share b (%d GiB) allocated 5 GiB with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT raised to 80G", shareBMemory/gib)
		}
	}
}

// timeSlicedPair is 3: two containers of one whole-GPU claim run the kernel
// at once. Two busy kernels time-sliced get about half the GPU each; each
// must run at under 0.8 of its rate alone. That holds unless the kernels
// barely overlap: with pairSeconds alone each, the one that starts first
// by d seconds runs at pairSeconds/(2*pairSeconds-d) of its rate, under
// 0.8 while d < 0.75*pairSeconds (2.25 s), far more than the containers'
// starts differ. The overlap is recorded.
func (r *containersRig) timeSlicedPair(t *testing.T) {
	if r.alone == nil {
		t.Fatal("no rate of the client alone (see 1-whole-gpu)")
	}
	perLaunch := r.alone.KernelSeconds / float64(r.alone.Launches)
	launches := min(max(int(math.Ceil(pairSeconds/perLaunch)), 100), 100000)
	const uid = "ctr-pair"
	ids := r.prepare(t, allocatedClaim(uid, []string{r.gpu.Name()}))
	args := []string{"--launches", strconv.Itoa(launches)}
	started := time.Now()
	pair := []*ctr{
		r.runc.start(t, ctrSpec{name: "pair-1", claim: uid, ids: ids, args: args}),
		r.runc.start(t, ctrSpec{name: "pair-2", claim: uid, uid: 1000, ids: ids, args: args}),
	}
	res := &pairResult{Launches: launches, AloneFlopsPerSecond: r.alone.FlopsPerSecond}
	r.res.Pair = res
	var windows [][2]float64
	for _, c := range pair {
		c.line(ctrLineTimeout + 4*pairSeconds*time.Second)
		if c.run.Report != nil {
			end := c.lineAt.Sub(started).Seconds()
			windows = append(windows, [2]float64{end - c.run.Report.KernelSeconds, end})
		}
	}
	for _, c := range pair {
		c.finish()
		res.Runs = append(res.Runs, c.run)
	}
	r.unprepare(t, uid)
	if len(windows) == 2 {
		res.OverlapSeconds = max(0, min(windows[0][1], windows[1][1])-max(windows[0][0], windows[1][0]))
	}
	for _, c := range pair {
		rep := c.run.Report
		if c.run.ExitCode != 0 || !rep.OK() {
			t.Errorf("%s: exit %d, report %+v; stderr:\n%s", c.run.Name, c.run.ExitCode, rep, c.run.Stderr)
			continue
		}
		rate := rep.FlopsPerSecond / r.alone.FlopsPerSecond
		res.RateOfAlone = append(res.RateOfAlone, rate)
		t.Logf("%s: %.1f TFLOP/s, %.2f of alone, kernels overlapping %.2f s", c.run.Name, rep.FlopsPerSecond/1e12, rate, res.OverlapSeconds)
		if rate >= 0.8 {
			t.Errorf("%s ran its kernel at %.2f of its rate alone beside the other container of the claim; want under 0.8 (time-sliced, about half)", c.run.Name, rate)
		}
	}
}

// profiled is 4: a claim that asks for an ncu run. ncu prints its CSV,
// and the client its line, into the report, not the container's output.
func (r *containersRig) profiled(t *testing.T) {
	const uid, profile = "ctr-profiled", "prism-containers"
	claim := allocatedClaim(uid, []string{r.gpu.Name()},
		opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true,"launchCount":3}}`))
	claim.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: profile}
	ids := r.prepare(t, claim)
	// The counters need CAP_SYS_ADMIN where the driver restricts them to
	// admins, as a profiled pod asks for in its securityContext.
	sysAdmin := func(s *specs.Spec) {
		if s.Process.Capabilities == nil {
			s.Process.Capabilities = &specs.LinuxCapabilities{}
		}
		c := s.Process.Capabilities
		c.Bounding = append(c.Bounding, "CAP_SYS_ADMIN")
		c.Effective = append(c.Effective, "CAP_SYS_ADMIN")
		c.Permitted = append(c.Permitted, "CAP_SYS_ADMIN")
	}
	c := r.runc.start(t, ctrSpec{name: "profiled", claim: uid, ids: ids, host: true, edit: sysAdmin, args: []string{"--launches", "20"}})
	c.wait(profiledTimeout)
	res := &profiledResult{Run: c.run, Profile: profile}
	r.res.Profiled = res
	r.unprepare(t, uid)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	waitForCollections(ctx, t, r.d)
	// What ncu left, as the plugin archived it.
	archive := filepath.Join(r.state, "profiles", "archive")
	copyDir(t, archive, filepath.Join(r.out, "profiled"))
	reports, _ := filepath.Glob(filepath.Join(archive, "*", profiling.ReportFile))
	for _, p := range reports {
		data, _ := os.ReadFile(p)
		res.ClientLine = res.ClientLine || slices.ContainsFunc(strings.Split(string(data), "\n"), func(l string) bool {
			var rep mpstest.GPUClientReport
			return json.Unmarshal([]byte(l), &rep) == nil && rep.OK()
		})
	}

	if c.run.ExitCode != 0 {
		t.Errorf("the profiled container exited %d; stderr:\n%s", c.run.ExitCode, c.run.Stderr)
	}
	var wp prismv1alpha1.WorkloadProfile
	if err := r.api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: profile}, &wp); err != nil {
		t.Fatalf("no WorkloadProfile ns/%s was published: %v", profile, err)
	}
	res.Status = &wp.Status
	t.Logf("WorkloadProfile ns/%s: bound type %q, %d launches, conditions %+v", profile, wp.Status.BoundType, wp.Status.KernelLaunches, wp.Status.Conditions)
	if wp.Status.BoundType == "" || wp.Status.BoundType == prismv1alpha1.BoundTypeUnknown {
		t.Errorf("the published profile has bound type %q; want one from the report (see profiled/ for ncu's log)", wp.Status.BoundType)
	}
	if !res.ClientLine {
		t.Errorf("the report holds no line of the client's: it did not run to its end under ncu")
	}
}

// nothingLeft is 5: once every claim is unprepared, nothing of them runs
// or stays on disk.
func (r *containersRig) nothingLeft(t *testing.T) {
	res := &leftResult{Processes: r.mpsProcesses(r.mpsPIDs)}
	r.res.Left = res
	entries, _ := os.ReadDir(filepath.Join(r.state, "mps"))
	for _, e := range entries {
		res.MPSDirs = append(res.MPSDirs, e.Name())
	}
	entries, _ = os.ReadDir(filepath.Join(r.state, "cdi"))
	for _, e := range entries {
		res.CDISpecs = append(res.CDISpecs, e.Name())
	}
	out, err := exec.Command(r.runc.runc, "--root", r.runc.root, "list", "--quiet").CombinedOutput()
	if err != nil {
		t.Errorf("runc list: %v: %s", err, out)
	}
	res.Containers = strings.Fields(string(out))
	for _, c := range r.d.state.checkpoint.List() {
		res.Claims = append(res.Claims, c.UID)
	}
	for key := range r.d.state.checkpoint.MPSDaemons() {
		res.Daemons = append(res.Daemons, key)
	}
	for what, left := range map[string]any{
		"MPS processes (daemons and servers seen, or any serving the state directory)": res.Processes,
		"MPS directories": res.MPSDirs, "CDI specs": res.CDISpecs, "runc containers": res.Containers,
		"prepared claims": res.Claims, "recorded daemons": res.Daemons,
	} {
		if v := fmt.Sprint(left); v != "[]" {
			t.Errorf("%s left after every claim was unprepared: %s", what, v)
		}
	}
}

// ---- containers ------------------------------------------------------------

// runcRig runs containers with runc, each from a bundle of its own: runc's
// default spec, a root file system of files copied from the host, and the
// devices of CDI IDs injected from the specs in cdiRoot.
type runcRig struct {
	runc, version string
	// root is runc's state directory, bundles where the bundles are made.
	root, bundles, cdiRoot string
	// out is where the bundles' specs and the containers' output are kept.
	out string
	// files are the host files each root file system gets, at the same
	// path; client is the program's path in it.
	files  []string
	client string
	// noPivot: / is the initial ramfs, whence pivot_root cannot move.
	noPivot bool
}

// containerClientDir is where a root file system has the client.
const containerClientDir = "/prism"

// newRuncRig makes root file systems of client and the shared libraries
// ldd lists for it and for the driver's libcuda, libcuda ("" for none)
// except NVIDIA's (libcuda*, libnvidia*), which must come from the CDI
// spec; with the loader's configuration and ldconfig, which
// nvidia-cdi-hook's update-ldcache runs for the container. libcuda needs
// glibc's libdl, libpthread and librt, which a client linked against a
// glibc that merged them into libc does not.
func newRuncRig(t *testing.T, runc, cdiRoot, out, client, libcuda string) *runcRig {
	t.Helper()
	r := &runcRig{runc: runc, root: t.TempDir(), bundles: t.TempDir(), cdiRoot: cdiRoot, out: out,
		client: filepath.Join(containerClientDir, filepath.Base(client))}
	version, err := exec.Command(runc, "--version").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --version: %v: %s", runc, err, version)
	}
	r.version = strings.TrimSpace(string(version))
	r.files = append(r.files, client)
	for _, bin := range []string{client, libcuda} {
		if bin != "" {
			r.files = append(r.files, sharedLibraries(t, bin)...)
		}
	}
	slices.Sort(r.files[1:])
	r.files = slices.Compact(r.files)
	for _, p := range []string{"/sbin/ldconfig", "/sbin/ldconfig.real", "/etc/ld.so.conf"} {
		if isRegularFile(p) {
			r.files = append(r.files, p)
		}
	}
	r.noPivot = initialRamfs()
	return r
}

// sharedLibraries are the shared libraries that ldd lists for bin, but
// NVIDIA's.
func sharedLibraries(t *testing.T, bin string) []string {
	t.Helper()
	ldd, err := exec.Command("ldd", bin).CombinedOutput()
	if err != nil && !bytes.Contains(ldd, []byte("not a dynamic executable")) {
		t.Fatalf("ldd %s: %v: %s", bin, err, ldd)
	}
	var libs []string
	for _, line := range strings.Split(string(ldd), "\n") {
		// "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or
		// "/lib64/ld-linux-x86-64.so.2 (0x...)"; "linux-vdso.so.1
		// (0x...)" is the kernel's.
		f := strings.Fields(line)
		if len(f) == 0 || nvidiaLibrary(f[0]) {
			continue
		}
		switch {
		case len(f) >= 3 && f[1] == "=>" && filepath.IsAbs(f[2]):
			libs = append(libs, f[2])
		case len(f) >= 3 && f[1] == "=>":
			t.Fatalf("ldd %s: %s", bin, strings.TrimSpace(line))
		case filepath.IsAbs(f[0]):
			libs = append(libs, f[0])
		}
	}
	return libs
}

// driverLibcuda is the driver's libcuda.so.1 in driverRoot, "" if it has
// none where the MPS Manager looks.
func driverLibcuda(t *testing.T, driverRoot string) string {
	for _, dir := range []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib"} {
		if p := filepath.Join(driverRoot, dir, "libcuda.so.1"); isRegularFile(p) {
			return p
		}
	}
	t.Logf("no libcuda.so.1 in the driver root %s: the root file systems get the client's libraries alone", driverRoot)
	return ""
}

// nvidiaLibrary says whether a library is the driver's, which a
// container gets from its CDI spec.
func nvidiaLibrary(p string) bool {
	base := filepath.Base(p)
	return strings.HasPrefix(base, "libcuda") || strings.HasPrefix(base, "libnvidia")
}

func isRegularFile(p string) bool {
	info, err := os.Stat(p)
	return err == nil && info.Mode().IsRegular()
}

// initialRamfs says whether / is the initial ramfs (rootfs in the mount
// table), which pivot_root cannot leave.
func initialRamfs() bool {
	mountinfo, _ := os.ReadFile("/proc/self/mountinfo")
	fstype := ""
	for _, line := range strings.Split(string(mountinfo), "\n") {
		// ID parent major:minor root mount-point options ... - type source
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == "/" {
			if i := slices.Index(f, "-"); i > 0 && i+1 < len(f) {
				fstype = f[i+1]
			}
		}
	}
	return fstype == "rootfs"
}

// ctrSpec is a container to run.
type ctrSpec struct {
	name  string
	claim string
	uid   int
	// ids are the CDI devices it gets.
	ids  []string
	args []string
	// edit changes its spec after the CDI edits, as its workload or its
	// pod's securityContext would.
	edit func(*specs.Spec)
	// host gives it the host's programs and libraries: /usr, /bin, /sbin,
	// /lib and /lib64 through overlays, which keep the host's unchanged.
	host bool
}

// ctr is a running container: runc run in the foreground, whose standard
// input and output are the container's.
type ctr struct {
	rig   *runcRig
	id    string
	run   *ctrRun
	cmd   *exec.Cmd
	stdin io.WriteCloser
	start time.Time
	// done is closed, and ended set, once runc has exited and its
	// output is read.
	done   chan struct{}
	ended  atomic.Bool
	stdout ctrOutput
	stderr bytes.Buffer
	// lineAt is when the client's line came.
	lineAt time.Time
}

// ctrOutput keeps what a container prints, and its first line with the
// time it came.
type ctrOutput struct {
	mu      sync.Mutex
	all     bytes.Buffer
	first   string
	firstAt time.Time
	// printed is closed at the first line.
	printed chan struct{}
}

func (o *ctrOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.all.Write(p)
	if line, _, ok := bytes.Cut(o.all.Bytes(), []byte("\n")); ok && o.firstAt.IsZero() {
		o.first, o.firstAt = string(line), time.Now()
		close(o.printed)
	}
	return len(p), nil
}

// firstLine is the first line and when it came; ok is false before.
func (o *ctrOutput) firstLine() (line string, at time.Time, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.first, o.firstAt, !o.firstAt.IsZero()
}

func (o *ctrOutput) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.all.String()
}

// ctrRun is a container's run, as recorded.
type ctrRun struct {
	Name  string   `json:"name"`
	Claim string   `json:"claim"`
	UID   int      `json:"uid"`
	Args  []string `json:"args"`
	// CDIDevices are its IDs; DeviceNodes, Mounts, Hooks and
	// InjectedEnv are what the spec got from them: its CUDA_, NVIDIA_ and
	// PRISM_ variables, the NVIDIA libraries among the mounts. Env is
	// the variables as it ran, after the edit.
	CDIDevices      []string `json:"cdi_devices"`
	DeviceNodes     []string `json:"device_nodes"`
	Mounts          int      `json:"mounts"`
	DriverLibraries []string `json:"driver_libraries"`
	Hooks           int      `json:"hooks"`
	InjectedEnv     []string `json:"injected_env"`
	Env             []string `json:"env"`
	// The outcome's ExitCode is runc's, the container's.
	mpstest.GPUClientOutcome
}

// bundle writes the container's bundle and returns its directory.
func (r *runcRig) bundle(t *testing.T, c ctrSpec, run *ctrRun) string {
	t.Helper()
	dir, err := os.MkdirTemp(r.bundles, c.name+"-")
	if err != nil {
		t.Fatal(err)
	}
	rootfs := filepath.Join(dir, "rootfs")
	if err := os.MkdirAll(rootfs, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(r.runc, "spec", "--bundle", dir).CombinedOutput(); err != nil {
		t.Fatalf("runc spec: %v: %s", err, out)
	}
	var spec specs.Spec
	readJSON(t, filepath.Join(dir, "config.json"), &spec)

	for _, d := range []string{"dev", "proc", "sys", "etc", "tmp"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(rootfs, "tmp"), 0o1777); err != nil {
		t.Fatal(err)
	}
	files := r.files[1:]
	if c.host {
		withHostSystem(t, rootfs)
		// The host's /etc/ld.so.conf only: its libraries are in place.
		files = slices.DeleteFunc(slices.Clone(files), func(p string) bool { return p != "/etc/ld.so.conf" })
	}
	copyFile(t, r.files[0], filepath.Join(rootfs, r.client))
	for _, p := range files {
		copyFile(t, p, filepath.Join(rootfs, p))
	}

	spec.Root = &specs.Root{Path: "rootfs"}
	spec.Hostname = c.name
	spec.Process.Terminal = false
	spec.Process.Args = append([]string{r.client}, c.args...)
	spec.Process.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/tmp"}
	// Before the injection: the CDI library gives the devices the
	// process's owner.
	spec.Process.User = specs.User{UID: uint32(c.uid), GID: uint32(c.uid)}
	// As test/e2e resolves a claim's IDs, and a runtime does.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(r.cdiRoot), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache over %s: %v", r.cdiRoot, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	if unresolved, err := cache.InjectDevices(&spec, c.ids...); err != nil {
		t.Fatalf("injecting %v (unresolved %v): %v", c.ids, unresolved, err)
	}
	run.InjectedEnv = interestingEnv(spec.Process.Env)
	if c.edit != nil {
		c.edit(&spec)
	}
	run.Env = interestingEnv(spec.Process.Env)

	for _, d := range spec.Linux.Devices {
		run.DeviceNodes = append(run.DeviceNodes, d.Path)
	}
	run.Mounts = len(spec.Mounts)
	for _, m := range spec.Mounts {
		if nvidiaLibrary(m.Destination) {
			run.DriverLibraries = append(run.DriverLibraries, m.Destination)
		}
	}
	if spec.Hooks != nil {
		run.Hooks = len(spec.Hooks.Prestart) + len(spec.Hooks.CreateRuntime) + len(spec.Hooks.CreateContainer) + len(spec.Hooks.StartContainer) + len(spec.Hooks.Poststart)
	}
	data, err := json.MarshalIndent(&spec, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, "config.json"), data)
	writeFile(t, filepath.Join(r.out, "bundles", c.name+".json"), data)
	return dir
}

// interestingEnv are the CUDA_, NVIDIA_ and PRISM_ variables of env.
func interestingEnv(env []string) []string {
	return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return !strings.HasPrefix(kv, "CUDA_") && !strings.HasPrefix(kv, "NVIDIA_") && !strings.HasPrefix(kv, "PRISM_")
	})
}

// hostSystemDirs are the host's directories of programs and libraries
// that a container with ctrSpec.host gets.
var hostSystemDirs = []string{"usr", "bin", "sbin", "lib", "lib64"}

// withHostSystem gives rootfs the host's hostSystemDirs: a link where the
// host has one (merged /usr), else an overlay of the host's directory, so
// that what runc and the hooks write there (mount points, library links)
// stays in the test's upper directory.
func withHostSystem(t *testing.T, rootfs string) {
	t.Helper()
	for _, name := range hostSystemDirs {
		host, in := "/"+name, filepath.Join(rootfs, name)
		info, err := os.Lstat(host)
		switch {
		case err != nil:
			continue
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err == nil {
				err = os.Symlink(target, in)
			}
			if err != nil {
				t.Fatal(err)
			}
		case info.IsDir():
			// On a tmpfs of their own: overlayfs takes no upper directory
			// on an overlay, which / may be.
			layers := t.TempDir()
			if err := unix.Mount("tmpfs", layers, "tmpfs", 0, "mode=0755"); err != nil {
				t.Fatalf("a tmpfs for the overlay of the host's %s: %v", host, err)
			}
			t.Cleanup(func() { _ = unix.Unmount(layers, unix.MNT_DETACH) })
			upper, work := filepath.Join(layers, "upper"), filepath.Join(layers, "work")
			for _, d := range []string{upper, work, in} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := unix.Mount("overlay", in, "overlay", 0, "lowerdir="+host+",upperdir="+upper+",workdir="+work); err != nil {
				t.Fatalf("an overlay of the host's %s: %v", host, err)
			}
			t.Cleanup(func() { _ = unix.Unmount(in, unix.MNT_DETACH) })
		}
	}
}

// start starts the container with runc in the foreground, its standard
// input a pipe that finish closes. It is killed when t ends if it still
// runs.
func (r *runcRig) start(t *testing.T, c ctrSpec) *ctr {
	t.Helper()
	run := &ctrRun{Name: c.name, Claim: c.claim, UID: c.uid, Args: c.args, CDIDevices: c.ids, GPUClientOutcome: mpstest.GPUClientOutcome{ExitCode: -1}}
	dir := r.bundle(t, c, run)
	x := &ctr{rig: r, id: "prism-" + c.name, run: run, done: make(chan struct{})}
	x.stdout.printed = make(chan struct{})
	args := []string{"--root", r.root, "--log", filepath.Join(r.out, "logs", c.name+".runc.log"), "run", "--bundle", dir}
	if r.noPivot {
		args = append(args, "--no-pivot")
	}
	x.cmd = exec.Command(r.runc, append(args, x.id)...)
	x.cmd.Stdout, x.cmd.Stderr = &x.stdout, &x.stderr
	// Should anything of the container outlive runc, its output does not
	// hold Wait.
	x.cmd.WaitDelay = 5 * time.Second
	var err error
	if x.stdin, err = x.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	x.start = time.Now()
	if err := x.cmd.Start(); err != nil {
		t.Fatalf("starting runc: %v", err)
	}
	go func() {
		_ = x.cmd.Wait()
		x.ended.Store(true)
		close(x.done)
	}()
	t.Cleanup(func() {
		if !x.ended.Load() {
			x.kill()
		}
		_ = exec.Command(r.runc, "--root", r.root, "delete", "--force", x.id).Run()
	})
	return x
}

// kill kills the container's process, then runc, and waits for runc.
func (x *ctr) kill() {
	_ = exec.Command(x.rig.runc, "--root", x.rig.root, "kill", x.id, "KILL").Run()
	select {
	case <-x.done:
	case <-time.After(10 * time.Second):
		_ = x.cmd.Process.Kill()
		<-x.done
	}
}

// line waits up to timeout for the client's line and records it; a
// container that exits without one is finished.
func (x *ctr) line(timeout time.Duration) {
	select {
	case <-x.stdout.printed:
	case <-x.done:
	case <-time.After(timeout):
		x.run.TimedOut = true
		return
	}
	text, at, ok := x.stdout.firstLine()
	if !ok {
		x.finish()
		return
	}
	x.lineAt = at
	x.run.LineSeconds = at.Sub(x.start).Seconds()
	x.run.Report = mpstest.ParseGPUClientLine(text)
}

// finish releases a held client, reads what it prints after its hold and
// waits up to ctrExitTimeout for the container to exit, then kills it;
// one that never printed its line is killed at once.
func (x *ctr) finish() {
	if x.run.Report == nil {
		x.kill()
	}
	x.wait(ctrExitTimeout)
	for _, l := range strings.Split(x.stdout.String(), "\n") {
		if after := mpstest.AfterHoldOf(l); after != "" {
			x.run.AfterHold = after
		}
	}
}

// wait closes the container's standard input and waits up to timeout for
// it to exit, then kills it; it records its exit and output.
func (x *ctr) wait(timeout time.Duration) {
	_ = x.stdin.Close()
	select {
	case <-x.done:
	case <-time.After(timeout):
		x.run.TimedOut = true
		x.kill()
	}
	if x.cmd.ProcessState != nil {
		x.run.ExitCode = x.cmd.ProcessState.ExitCode()
	}
	logs := filepath.Join(x.rig.out, "logs", x.run.Name)
	_ = os.WriteFile(logs+".stdout", []byte(x.stdout.String()), 0o644)
	_ = os.WriteFile(logs+".stderr", x.stderr.Bytes(), 0o644)
	s := x.stderr.String()
	x.run.Stderr = s[max(0, len(s)-4000):]
}

// ---- processes and files -----------------------------------------------------

// mpsProcesses are the running MPS control daemons and servers that are
// one of pids, or whose pipe directory is under the state directory.
func (r *containersRig) mpsProcesses(pids []int) []mpstest.Process {
	return mpstest.Processes(func(p mpstest.Process) bool {
		return slices.Contains(pids, p.PID) || strings.HasPrefix(p.PipeDir, r.state+"/")
	})
}

func abs(n int) int { return max(n, -n) }

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	info, err := os.Stat(from)
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(from)
	if err == nil {
		err = os.MkdirAll(filepath.Dir(to), 0o755)
	}
	if err == nil {
		err = os.WriteFile(to, data, info.Mode().Perm())
	}
	if err != nil {
		t.Fatalf("copying %s into a root file system: %v", from, err)
	}
}

// copyDir keeps the regular files under from in to, for a person to read.
func copyDir(t *testing.T, from, to string) {
	t.Helper()
	_ = filepath.WalkDir(from, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		rel, _ := filepath.Rel(from, p)
		data, err := os.ReadFile(p)
		if err == nil {
			err = os.MkdirAll(filepath.Dir(filepath.Join(to, rel)), 0o755)
		}
		if err == nil {
			err = os.WriteFile(filepath.Join(to, rel), data, 0o644)
		}
		if err != nil {
			t.Errorf("keeping %s: %v", p, err)
		}
		return nil
	})
}

func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err == nil {
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
}

// ---- results ---------------------------------------------------------------

// containersResults is results.json.
type containersResults struct {
	GPU         gpuRecord `json:"gpu"`
	DriverRoot  string    `json:"driver_root"`
	NVMLLibrary string    `json:"nvml_library,omitempty"`
	Runc        string    `json:"runc"`
	RuncVersion string    `json:"runc_version"`
	CDIHook     string    `json:"cdi_hook"`
	NCUDir      string    `json:"ncu_dir"`
	// Rootfs are the host files each container's root file system has
	// (the client first); NoPivot, that runc ran with --no-pivot.
	Rootfs   []string        `json:"rootfs"`
	NoPivot  bool            `json:"no_pivot,omitempty"`
	Whole    *ctrRun         `json:"whole_gpu"`
	Shares   *sharesResult   `json:"mps_shares"`
	Pair     *pairResult     `json:"time_sliced_pair"`
	Profiled *profiledResult `json:"profiled"`
	Left     *leftResult     `json:"left"`
}

type gpuRecord struct {
	Name        string `json:"name"`
	UUID        string `json:"uuid"`
	Product     string `json:"product"`
	SMs         int    `json:"sms"`
	MemoryBytes uint64 `json:"memory_bytes"`
}

type sharesResult struct {
	Daemons map[string]daemonRecord `json:"daemons"`
	// A ran as UID 1000 with its CUDA_MPS_ variables unset, B as UID
	// 2000 with them raised; BBesideA, that B ran while A held its server.
	A        *ctrRun `json:"a"`
	B        *ctrRun `json:"b"`
	BBesideA bool    `json:"b_beside_a"`
	// Servers are the MPS servers of each share's pipe directory while
	// both clients held theirs.
	Servers map[string][]int `json:"servers"`
}

type daemonRecord struct {
	PID     int    `json:"pid"`
	PipeDir string `json:"pipe_dir"`
	ShmDir  string `json:"shm_dir"`
	Limits  string `json:"limits"`
}

type pairResult struct {
	Launches            int       `json:"launches"`
	AloneFlopsPerSecond float64   `json:"alone_flops_per_second"`
	Runs                []*ctrRun `json:"runs"`
	RateOfAlone         []float64 `json:"rate_of_alone"`
	// OverlapSeconds is how long both kernels ran at once, as the
	// containers' lines and kernel times place them.
	OverlapSeconds float64 `json:"overlap_seconds"`
}

type profiledResult struct {
	Run     *ctrRun `json:"run"`
	Profile string  `json:"profile"`
	// ClientLine: the report holds the client's line, which it printed
	// to ncu's standard output.
	ClientLine bool                                 `json:"client_line_in_report"`
	Status     *prismv1alpha1.WorkloadProfileStatus `json:"status,omitempty"`
}

type leftResult struct {
	Processes  []mpstest.Process `json:"processes"`
	MPSDirs    []string          `json:"mps_dirs"`
	CDISpecs   []string          `json:"cdi_specs"`
	Containers []string          `json:"containers"`
	Claims     []string          `json:"claims"`
	Daemons    []string          `json:"daemons"`
}

func (r *containersRig) write(t *testing.T) {
	data, err := json.MarshalIndent(r.res, "", "  ")
	if err != nil {
		t.Errorf("encoding the results: %v", err)
		return
	}
	if err := os.WriteFile(filepath.Join(r.out, "results.json"), append(data, '\n'), 0o644); err != nil {
		t.Errorf("recording the results: %v", err)
	}
}
