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

package sampler

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/plugin/usage"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

const (
	// gpuSampleEvery is how often the test reads the GPU: often enough
	// for a dozen samples in a few seconds, and longer than NVML's
	// shortest utilisation period (1/6 s), so that samples seldom overlap.
	gpuSampleEvery = 250 * time.Millisecond
	// gpuSettle is left out at the start of a run: NVML's utilisation
	// and GPM's first interval still hold the time before it.
	gpuSettle = 500 * time.Millisecond
	// contextOverhead bounds what a process holds on the GPU beyond what
	// it allocated: the CUDA context, its module images and heaps.
	contextOverhead = 1 << 30
)

// kernelsResult is the JSON line the CUDA test program prints at exit
// (hack/gpu-check/kernels.cu).
type kernelsResult struct {
	Job            string  `json:"job"`
	PID            int     `json:"pid"`
	Launches       int64   `json:"launches"`
	Seconds        float64 `json:"seconds"`
	PerSecond      float64 `json:"per_second"`
	BytesPerLaunch float64 `json:"bytes_per_launch"`
	FlopsPerLaunch float64 `json:"flops_per_launch"`
	BusyFraction   float64 `json:"busy_fraction"`
	AllocatedBytes int64   `json:"allocated_bytes"`
	GPUSeconds     float64 `json:"gpu_seconds"`
}

// gpuProcess is one process NVML listed on the GPU in a sample.
type gpuProcess struct {
	MemoryBytes int64 `json:"memory_bytes"`
	UtilPercent int   `json:"util_pct"`
}

// gpuSample is one read of the sampler, as recorded.
type gpuSample struct {
	// OffsetSeconds is the time of the read since the run's start.
	OffsetSeconds float64 `json:"offset_s"`
	// Read is false where the sampler's read returned nothing.
	Read bool `json:"read"`
	// InWindow: the sample counts towards the means.
	InWindow            bool    `json:"in_window"`
	DutyCyclePercent    int     `json:"duty_pct"`
	MemoryBytes         int64   `json:"memory_bytes"`
	SMActivityPercent   float64 `json:"sm_pct"`
	DRAMActivityPercent float64 `json:"dram_pct"`
	// ProcsRead is false where the GPU's processes could not be listed.
	ProcsRead bool `json:"procs_read"`
	// ProcUtil is false where NVML gave no per-process utilisation.
	ProcUtil  bool                  `json:"proc_util"`
	Processes map[uint32]gpuProcess `json:"processes,omitempty"`
	// The job's process, where NVML listed it.
	JobMemoryBytes *int64 `json:"job_memory_bytes,omitempty"`
	JobUtilPercent *int   `json:"job_util_pct,omitempty"`
}

// gpuMeans are the figures compared with the job's own: means of the
// samples in the window where the figure was known, nil where none was.
type gpuMeans struct {
	Samples             int      `json:"samples"`
	DutyCyclePercent    *float64 `json:"duty_pct"`
	SMActivityPercent   *float64 `json:"sm_pct"`
	DRAMActivityPercent *float64 `json:"dram_pct"`
	JobUtilPercent      *float64 `json:"job_util_pct"`
	// PeakJobMemoryBytes is over every sample of the run, the window's
	// edges too: the allocation does not change during it.
	PeakJobMemoryBytes *int64 `json:"peak_job_memory_bytes"`
}

// sampledRun is a job run with the samples taken during it.
type sampledRun struct {
	Name string        `json:"name"`
	Args []string      `json:"args"`
	Job  kernelsResult `json:"job"`
	// NVMLPID is the job's process as NVML lists it; PIDMatched is false
	// where it was not the program's own PID (the test in another PID
	// namespace than the driver's) and the only process on the GPU was
	// taken instead.
	NVMLPID    uint32      `json:"nvml_pid"`
	PIDMatched bool        `json:"pid_matched"`
	Samples    []gpuSample `json:"samples"`
	Means      gpuMeans    `json:"means"`
}

// jobFigures is one row of jobs.json, which becomes jobs.csv's measured
// columns.
type jobFigures struct {
	Job       string   `json:"job"`
	UtilPct   *float64 `json:"util_pct"`
	SMPct     *float64 `json:"sm_pct"`
	DRAMPct   *float64 `json:"dram_pct"`
	MemMiB    *float64 `json:"mem_mib"`
	PerSecond float64  `json:"per_second"`
}

// TestUsageSamplerOnRealGPU runs the CUDA test program's jobs on GPU 0 and
// reads the GPU with the plugin's own sampler (Sampler.read) every
// 250 ms while each runs, then holds the sampled figures against what the
// job says it did:
//
//	PRISM_GPU_KERNELS=/path/prism-gpu-kernels PRISM_GPU_OUT=/tmp/out \
//	go test -tags gpu -run TestUsageSamplerOnRealGPU -v ./internal/plugin/usage/sampler/
//
// It records every sample in $PRISM_GPU_OUT/usage/samples.json and each
// job's means in $PRISM_GPU_OUT/usage/jobs.json. Jobs start at a barrier
// (--sync), so that a run's start is known to the millisecond and its
// start-up (CUDA context, host-side input, warm-up) stays out of the
// window.
func TestUsageSamplerOnRealGPU(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	kernels := os.Getenv("PRISM_GPU_KERNELS")
	if kernels == "" {
		t.Fatal("PRISM_GPU_KERNELS is not set: it names the CUDA test program (hack/gpu-check/kernels.cu)")
	}
	if _, err := os.Stat(kernels); err != nil {
		t.Fatalf("PRISM_GPU_KERNELS: %v", err)
	}
	out := os.Getenv("PRISM_GPU_OUT")
	if out == "" {
		out = t.TempDir()
	}
	out = filepath.Join(out, "usage")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	root := os.Getenv("PRISM_DRIVER_ROOT")
	if root == "" {
		root = "/"
	}
	lib, err := nvml.New(ctx, root)
	if err != nil {
		t.Fatalf("nvml.New: %v", err)
	}
	devices, err := nvml.Discover(ctx, lib, nvml.Options{})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(devices) == 0 {
		t.Fatal("NVML reports no GPUs")
	}
	dev := devices[0]
	bandwidth := float64(dev.MemoryBandwidthGBps()) * 1e9
	// Hopper has GPM; there, unknown SM and DRAM activity is a failure.
	gpmRequired := strings.Contains(dev.ProductName, "H100")
	t.Logf("GPU 0: %s, %s, published bandwidth %.0f GB/s, GPM required: %t", dev.UUID, dev.ProductName, bandwidth/1e9, gpmRequired)
	if bandwidth <= 0 {
		t.Fatalf("GPU 0 has no published bandwidth")
	}

	u := New(Config{NVML: lib, ProcRoot: "/proc"}, Env{Dir: t.TempDir()})
	t.Cleanup(func() {
		u.shutdownNVML(ctx)
		u.queue.ShutDown()
	})
	if !u.initNVML(ctx) {
		t.Fatal("the sampler could not initialise NVML")
	}
	g := &gpuReader{u: u, uuid: dev.UUID}

	var runs []*sampledRun
	byJob := map[string]*sampledRun{}
	defer func() {
		writeUsageRecords(t, out, runs, byJob)
	}()

	for _, tc := range []struct {
		name string
		args []string
		// job names the row of jobs.json the run gives, if any.
		job   string
		check func(t *testing.T, r *sampledRun)
	}{
		{
			name: "fmaloop", job: "fmaloop",
			args: []string{"fmaloop", "--seconds", "3", "--duty", "1"},
			check: func(t *testing.T, r *sampledRun) {
				if m := r.Means.DutyCyclePercent; m != nil && *m < 90 {
					t.Errorf("mean duty cycle %.1f%% of a job busy all the time; want >= 90", *m)
				}
				if m := r.Means.SMActivityPercent; m != nil && *m < 60 {
					t.Errorf("mean GPM SM activity %.1f%% of one full wave of FMA loops after another; want >= 60", *m)
				}
			},
		},
		{
			name: "fmaloop-half",
			args: []string{"fmaloop", "--seconds", "4", "--duty", "0.5"},
			check: func(t *testing.T, r *sampledRun) {
				want := 100 * r.Job.BusyFraction
				if m := r.Means.DutyCyclePercent; m != nil && math.Abs(*m-want) > 12 {
					t.Errorf("mean duty cycle %.1f%%; want within 12 points of the job's busy share %.1f%%", *m, want)
				}
			},
		},
		{
			name: "vectoradd", job: "vectoradd",
			args: []string{"vectoradd", "--seconds", "3"},
			check: func(t *testing.T, r *sampledRun) {
				achieved := r.Job.BytesPerLaunch * r.Job.PerSecond
				want := 100 * achieved / bandwidth
				t.Logf("vectoradd moved %.0f GB/s, %.1f%% of the published %.0f GB/s", achieved/1e9, want, bandwidth/1e9)
				m := r.Means.DRAMActivityPercent
				if m == nil {
					t.Logf("no GPM DRAM activity to compare")
					return
				}
				t.Logf("GPM DRAM activity %.1f%%, the job's achieved share of the bandwidth %.1f%%", *m, want)
				if math.Abs(*m-want) > 20 {
					t.Errorf("mean GPM DRAM activity %.1f%%; want within 20 points of %.1f%%", *m, want)
				}
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := runSampled(ctx, t, g, kernels, tc.name, tc.args)
			runs = append(runs, r)
			if tc.job != "" {
				byJob[tc.job] = r
			}
			checkSampled(t, r, gpmRequired)
			tc.check(t, r)
		})
	}
	// Alone, for jobs.csv: only that they ran and were sampled.
	for _, job := range []string{"tinygrid", "gemm-2048", "gemm-8192", "copy-16m", "copy-2g"} {
		t.Run(job, func(t *testing.T) {
			r := runSampled(ctx, t, g, kernels, job, []string{job, "--seconds", "2"})
			runs = append(runs, r)
			byJob[job] = r
			if r.Means.Samples == 0 {
				t.Errorf("no sample read during the run")
			}
		})
	}
}

// checkSampled asserts what holds of every run the test compares: enough
// samples, GPM where the GPU has it, and the job's process with its
// memory. summarize checked the sample of a GPU a claim holds alone.
func checkSampled(t *testing.T, r *sampledRun, gpmRequired bool) {
	t.Helper()
	if r.Means.Samples < 4 {
		t.Fatalf("%d samples in the window; want at least 4", r.Means.Samples)
	}
	if r.Means.DutyCyclePercent == nil {
		t.Errorf("no sample has a duty cycle")
	}
	if gpmRequired && (r.Means.SMActivityPercent == nil || r.Means.DRAMActivityPercent == nil) {
		t.Errorf("GPM gave no SM or DRAM activity (sm known: %t, dram known: %t) on a GPU that has GPM",
			r.Means.SMActivityPercent != nil, r.Means.DRAMActivityPercent != nil)
	}
	if !slices.ContainsFunc(r.Samples, func(s gpuSample) bool { return s.ProcsRead }) {
		t.Errorf("NVML never listed the GPU's processes (see the sampler's log)")
	}
	switch peak := r.Means.PeakJobMemoryBytes; {
	case peak == nil:
		t.Errorf("the job's process (pid %d) is not among the GPU's processes, or NVML gave no memory for it", r.Job.PID)
	case *peak < r.Job.AllocatedBytes || *peak > r.Job.AllocatedBytes+contextOverhead:
		t.Errorf("the job's process holds %d MiB; want between what it allocated, %d MiB, and 1 GiB more",
			*peak>>20, r.Job.AllocatedBytes>>20)
	}
	if !r.PIDMatched {
		t.Logf("NVML listed the job as pid %d, not %d: the test runs in another PID namespace than the one NVML answers in", r.NVMLPID, r.Job.PID)
	}
}

// gpuReader reads a GPU through the sampler's own read, whole GPU and
// processes in one call as the plugin does where claims hold the GPU both
// alone and shared. Where the processes cannot be listed that call returns
// nothing; it then reads them apart, so that the whole GPU's figures are
// still recorded.
type gpuReader struct {
	u     *Sampler
	uuid  string
	split bool
}

// read returns the reading, nil where the GPU could not be read, and
// whether its processes were listed.
func (g *gpuReader) read(ctx context.Context) (*deviceReading, bool) {
	if !g.split {
		if rd := g.u.read(ctx, g.uuid, need{whole: true, procs: true}); rd != nil {
			return rd, true
		}
		g.split = true
		klog.FromContext(ctx).Info("The sampler read nothing of the GPU and its processes together: reading them apart from now on", "gpu", g.uuid)
	}
	rd := g.u.read(ctx, g.uuid, need{whole: true})
	if rd == nil {
		return nil, false
	}
	p := g.u.read(ctx, g.uuid, need{procs: true})
	if p == nil {
		return rd, false
	}
	rd.procs, rd.procUtil = p.procs, p.procUtil
	return rd, true
}

// runSampled runs the CUDA test program with args, releases it from its
// barrier and reads the GPU with the sampler every gpuSampleEvery until
// it exits.
func runSampled(ctx context.Context, t *testing.T, g *gpuReader, kernels, name string, args []string) *sampledRun {
	t.Helper()
	syncDir := t.TempDir()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(kernels, append(slices.Clone(args), "--sync", syncDir)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", kernels, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	running := true
	// A failing test must not leave the job on the GPU for the next.
	t.Cleanup(func() {
		if running {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	// failed ends a job still running first: its output is read only
	// once the program is gone.
	failed := func(format string, a ...any) {
		t.Helper()
		if running {
			_ = cmd.Process.Kill()
			<-exited
			running = false
		}
		t.Fatalf("%s: %s\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), fmt.Sprintf(format, a...), stdout.Bytes(), stderr.Bytes())
	}

	// Set-up and warm-up take seconds (host-side random input, cuBLAS);
	// the job says when it is ready.
	ready := filepath.Join(syncDir, "ready."+strconv.Itoa(cmd.Process.Pid))
	for giveUp := time.Now().Add(2 * time.Minute); ; {
		if _, err := os.Stat(ready); err == nil {
			break
		}
		select {
		case err := <-exited:
			running = false
			failed("exited before its barrier: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(giveUp) {
			failed("not ready after 2 minutes")
		}
	}
	start := time.Now().Add(100 * time.Millisecond)
	tmp := filepath.Join(syncDir, ".go")
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(start.UnixNano(), 10)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Renamed into place: the job must never read half a start time.
	if err := os.Rename(tmp, filepath.Join(syncDir, "go")); err != nil {
		t.Fatal(err)
	}

	var readings []*deviceReading
	var procsRead []bool
	var at []time.Duration
	ticker := time.NewTicker(gpuSampleEvery)
	defer ticker.Stop()
	deadline := time.After(time.Until(start) + 2*time.Minute)
	var waitErr error
sampling:
	for {
		now := time.Now()
		rd, ok := g.read(ctx)
		readings, procsRead = append(readings, rd), append(procsRead, ok)
		at = append(at, now.Sub(start))
		select {
		case waitErr = <-exited:
			running = false
			break sampling
		case <-ticker.C:
		case <-deadline:
			failed("still running 2 minutes after its start")
		}
	}
	if waitErr != nil {
		failed("%v", waitErr)
	}
	r := &sampledRun{Name: name, Args: args}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r.Job); err != nil {
		failed("its last line of output is not the result: %v", err)
	}
	if r.Job.Seconds <= 0 {
		failed("ran for %g s", r.Job.Seconds)
	}
	r.identify(cmd.Process.Pid, readings, at)
	r.summarize(t, readings, procsRead, at)
	t.Logf("%s: %d launches in %.3f s (%.1f/s), busy %.3f, allocated %d MiB, GPU time %.3f s",
		strings.Join(args, " "), r.Job.Launches, r.Job.Seconds, r.Job.PerSecond, r.Job.BusyFraction, r.Job.AllocatedBytes>>20, r.Job.GPUSeconds)
	t.Logf("%s: %d samples in the window: duty %s%%, SM %s%%, DRAM %s%%, job util %s%%, job memory %s MiB",
		name, r.Means.Samples, fmtPtr(r.Means.DutyCyclePercent), fmtPtr(r.Means.SMActivityPercent),
		fmtPtr(r.Means.DRAMActivityPercent), fmtPtr(r.Means.JobUtilPercent), fmtPtr(mib(r.Means.PeakJobMemoryBytes)))
	return r
}

// inWindow: from gpuSettle after the start to the job's end (a read at
// the end still covers a period of the run).
func (r *sampledRun) inWindow(at time.Duration) bool {
	return at >= gpuSettle && at.Seconds() <= r.Job.Seconds
}

// identify finds the job among the processes NVML listed in the window:
// by its PID, or, where NVML answers in another PID namespace, as the one
// process there was.
func (r *sampledRun) identify(pid int, readings []*deviceReading, at []time.Duration) {
	seen := map[uint32]bool{}
	for i, rd := range readings {
		if rd == nil || !r.inWindow(at[i]) {
			continue
		}
		for p := range rd.procs {
			seen[p] = true
		}
	}
	switch {
	case seen[uint32(pid)]:
		r.NVMLPID, r.PIDMatched = uint32(pid), true
	case len(seen) == 1:
		for p := range seen {
			r.NVMLPID = p
		}
	}
}

// summarize records the samples and their means, and checks that the
// sampler's sample of a GPU held alone is the whole GPU's figures.
func (r *sampledRun) summarize(t *testing.T, readings []*deviceReading, procsRead []bool, at []time.Duration) {
	t.Helper()
	var duty, sm, dram, util []float64
	for i, rd := range readings {
		s := gpuSample{OffsetSeconds: at[i].Seconds(), InWindow: r.inWindow(at[i]), Read: rd != nil, ProcsRead: procsRead[i],
			DutyCyclePercent: usage.Unknown, MemoryBytes: usage.Unknown, SMActivityPercent: usage.Unknown, DRAMActivityPercent: usage.Unknown}
		if rd != nil {
			s.DutyCyclePercent, s.MemoryBytes, s.SMActivityPercent, s.DRAMActivityPercent = rd.dutyCycle, rd.memory, rd.sm, rd.dram
			s.ProcUtil = rd.procUtil
			s.Processes = map[uint32]gpuProcess{}
			for p, pu := range rd.procs {
				s.Processes[p] = gpuProcess{MemoryBytes: pu.memory, UtilPercent: pu.util}
			}
			if p, ok := rd.procs[r.NVMLPID]; ok && r.NVMLPID != 0 {
				if p.memory != usage.Unknown {
					s.JobMemoryBytes = &p.memory
					if r.Means.PeakJobMemoryBytes == nil || p.memory > *r.Means.PeakJobMemoryBytes {
						r.Means.PeakJobMemoryBytes = &p.memory
					}
				}
				if rd.procUtil {
					s.JobUtilPercent = &p.util
				}
			}
			want := usage.Sample{DutyCyclePercent: rd.dutyCycle, MemoryBytes: rd.memory, SMActivityPercent: rd.sm, DRAMActivityPercent: rd.dram}
			if diff := cmp.Diff(want, rd.whole()); diff != "" {
				t.Errorf("sample at %.2f s of a GPU held alone is not the whole GPU's (-want +got):\n%s", s.OffsetSeconds, diff)
			}
		}
		r.Samples = append(r.Samples, s)
		if !s.InWindow || rd == nil {
			continue
		}
		r.Means.Samples++
		if s.DutyCyclePercent != usage.Unknown {
			duty = append(duty, float64(s.DutyCyclePercent))
		}
		if s.SMActivityPercent != usage.Unknown {
			sm = append(sm, s.SMActivityPercent)
		}
		if s.DRAMActivityPercent != usage.Unknown {
			dram = append(dram, s.DRAMActivityPercent)
		}
		if s.JobUtilPercent != nil {
			util = append(util, float64(*s.JobUtilPercent))
		}
	}
	r.Means.DutyCyclePercent, r.Means.SMActivityPercent = mean(duty), mean(sm)
	r.Means.DRAMActivityPercent, r.Means.JobUtilPercent = mean(dram), mean(util)
	for _, s := range r.Samples {
		t.Logf("  %6.2f s window=%-5t duty=%3d%% mem=%6d MiB sm=%6.1f dram=%6.1f job mem=%s MiB job util=%s procs=%d",
			s.OffsetSeconds, s.InWindow, s.DutyCyclePercent, s.MemoryBytes>>20, s.SMActivityPercent, s.DRAMActivityPercent,
			fmtPtr(mib(s.JobMemoryBytes)), fmtIntPtr(s.JobUtilPercent), len(s.Processes))
	}
}

// writeUsageRecords writes samples.json and jobs.json, and logs the table
// jobs.json holds.
func writeUsageRecords(t *testing.T, out string, runs []*sampledRun, byJob map[string]*sampledRun) {
	t.Helper()
	var jobs []jobFigures
	t.Logf("%-10s %8s %8s %8s %9s %12s", "job", "util %", "sm %", "dram %", "mem MiB", "per second")
	for _, job := range []string{"vectoradd", "fmaloop", "tinygrid", "gemm-2048", "gemm-8192", "copy-16m", "copy-2g"} {
		r, ok := byJob[job]
		if !ok {
			continue
		}
		f := jobFigures{Job: job, UtilPct: r.Means.DutyCyclePercent, SMPct: r.Means.SMActivityPercent,
			DRAMPct: r.Means.DRAMActivityPercent, MemMiB: mib(r.Means.PeakJobMemoryBytes), PerSecond: r.Job.PerSecond}
		jobs = append(jobs, f)
		t.Logf("%-10s %8s %8s %8s %9s %12.1f", job, fmtPtr(f.UtilPct), fmtPtr(f.SMPct), fmtPtr(f.DRAMPct), fmtPtr(f.MemMiB), f.PerSecond)
	}
	for name, v := range map[string]any{"samples.json": runs, "jobs.json": jobs} {
		data, err := json.MarshalIndent(v, "", "  ")
		if err != nil {
			t.Errorf("encoding %s: %v", name, err)
			continue
		}
		if err := os.WriteFile(filepath.Join(out, name), append(data, '\n'), 0o644); err != nil {
			t.Errorf("recording %s: %v", name, err)
		}
	}
}

func mean(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	m := sum / float64(len(xs))
	return &m
}

func mib(b *int64) *float64 {
	if b == nil {
		return nil
	}
	m := float64(*b) / (1 << 20)
	return &m
}

func fmtPtr(v *float64) string {
	if v == nil {
		return "-"
	}
	return strconv.FormatFloat(*v, 'f', 1, 64)
}

func fmtIntPtr(v *int) string {
	if v == nil {
		return "-"
	}
	return strconv.Itoa(*v)
}
