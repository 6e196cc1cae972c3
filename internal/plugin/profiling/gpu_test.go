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

package profiling

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/ncu"
	"github.com/prismgpu/prism/pkg/profile"
)

// ncuTimeout bounds one ncu run: its start-up takes seconds, a handful of
// profiled launches less than that.
const ncuTimeout = 3 * time.Minute

// TestGPUBoundTypes runs the real CUDA test program under the shim and the
// real ncu, with the claim's CDI edits applied by hand, and checks that
// each job's report classifies as what the job was written to be. It also
// captures ncu's default details page of the single-kernel jobs directly
// (not through the shim), so that both CSV layouts the parser reads come
// from a real ncu; the captures replace the hand-written fixtures in
// pkg/ncu/testdata.
//
//	PRISM_GPU_KERNELS=/path/prism-gpu-kernels NCU_DIR=/opt/nvidia/nsight-compute/<version> \
//	PRISM_GPU_OUT=/tmp/out go test -tags gpu -run TestGPUBoundTypes -v ./internal/plugin/profiling/
//
// Records go to $PRISM_GPU_OUT/ncu: <job>_raw.csv (the report the shim's
// ncu wrote), <job>.log (ncu's log), <job>_status.json (what Collect made
// of it), <job>_details.csv (the direct capture) and version.txt.
func TestGPUBoundTypes(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	kernels := os.Getenv("PRISM_GPU_KERNELS")
	if kernels == "" {
		t.Fatal("PRISM_GPU_KERNELS is not set: it names the CUDA test program (hack/gpu-check/kernels.cu)")
	}
	if _, err := os.Stat(kernels); err != nil {
		t.Fatalf("PRISM_GPU_KERNELS: %v", err)
	}
	ncuDir := os.Getenv("NCU_DIR")
	if ncuDir == "" {
		t.Fatal("NCU_DIR is not set: it names the Nsight Compute install directory holding the ncu launcher")
	}
	ncuPath := filepath.Join(ncuDir, "ncu")
	if _, err := os.Stat(ncuPath); err != nil {
		t.Fatalf("NCU_DIR: %v", err)
	}
	// A skip on the GPU machine would hide the check, so a node that may
	// not profile fails it.
	var pe *PermissionError
	if err := CheckPermissions("/proc"); errors.As(err, &pe) {
		t.Fatalf("cannot profile here: %v", err)
	} else if err != nil {
		t.Fatalf("CheckPermissions: %v", err)
	}
	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("CC") == "" {
		t.Fatal("neither gcc nor $CC is available to compile the preload shim")
	}
	out := os.Getenv("PRISM_GPU_OUT")
	if out == "" {
		out = t.TempDir()
	}
	out = filepath.Join(out, "ncu")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	shim := buildShim(ctx, t)

	version, err := exec.CommandContext(ctx, ncuPath, "--version").Output()
	if err != nil {
		t.Fatalf("ncu --version: %v", err)
	}
	writeRecord(t, filepath.Join(out, "version.txt"), version)
	t.Logf("ncu --version:\n%s", version)

	for _, tc := range []struct {
		job string
		// launches is how many the report must hold: mixed launches
		// 2x vectorAdd, fmaLoop and 4x tinyKernel.
		launches int32
		want     prismv1alpha1.BoundType
		// kernels are the names (as in hack/gpu-check/kernels.cu) the
		// report must name.
		kernels []string
		// details: capture ncu's details page of the job too.
		details bool
	}{
		{job: "vectoradd", launches: 1, want: prismv1alpha1.BoundTypeMemoryBound, kernels: []string{"vectorAdd"}, details: true},
		{job: "fmaloop", launches: 1, want: prismv1alpha1.BoundTypeComputeBound, kernels: []string{"fmaLoop"}, details: true},
		{job: "tinygrid", launches: 1, want: prismv1alpha1.BoundTypeLatencyBound, kernels: []string{"tinyKernel"}, details: true},
		// mixed: vectorAdd, memory-bound, holds most of the GPU time
		// (79 % on an H100, 76 % on an H200), though on the H200 the
		// averaged throughputs are both under 60 %.
		{job: "mixed", launches: 7, want: prismv1alpha1.BoundTypeMemoryBound, kernels: []string{"vectorAdd", "fmaLoop", "tinyKernel"}},
	} {
		t.Run(tc.job, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			work := t.TempDir()
			opts := Options{StateDir: filepath.Join(work, "state"), NCUDir: ncuDir, ShimPath: shim}
			if os.Geteuid() == 0 {
				// ncu writes its report into a tmpfs, as on a node.
				opts.DirSize = DefaultDirSize
				unmountAtCleanup(t, opts.StateDir)
			}
			edits, err := Prepare(ctx, opts, testClaimUID, &gpuv1alpha1.GpuProfiling{Enabled: true, LaunchCount: ptr.To(tc.launches)})
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			// The container's environment is the edits' alone; the
			// program may need the toolkit's libraries (cuBLAS) from
			// where the host's loader is told to find them.
			extra := []string{"HOME=" + work}
			for _, k := range []string{"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES"} {
				if v, ok := os.LookupEnv(k); ok {
					extra = append(extra, k+"="+v)
				}
			}
			runCtx, cancel := context.WithTimeout(ctx, ncuTimeout)
			defer cancel()
			cmd := exec.CommandContext(runCtx, kernels, tc.job)
			cmd.Env = containerEnv(t, edits, extra...)
			progOut, err := cmd.CombinedOutput()
			t.Logf("%s under the shim:\n%s", tc.job, progOut)
			if err != nil {
				t.Fatalf("%s under the shim: %v", tc.job, err)
			}
			dir, err := Detach(opts.StateDir, jobFor(testClaimUID))
			if err != nil {
				t.Fatal(err)
			}
			if dir == "" {
				t.Fatal("Detach found no report directory")
			}
			// Kept before Collect, so that a failure leaves what ncu wrote.
			raw := copyRecord(t, filepath.Join(dir, outDir, ReportFile), filepath.Join(out, tc.job+"_raw.csv"))
			ncuLog := copyRecord(t, filepath.Join(dir, outDir, LogFile), filepath.Join(out, tc.job+".log"))
			st, err := Collect(ctx, dir, profile.Options{})
			if err != nil {
				t.Fatalf("Collect: %v\nreport.csv:\n%s\nncu.log:\n%s", err, raw, ncuLog)
			}
			status, err := json.MarshalIndent(st, "", "  ")
			if err != nil {
				t.Fatal(err)
			}
			writeRecord(t, filepath.Join(out, tc.job+"_status.json"), append(status, '\n'))
			t.Logf("status:\n%s", status)
			if err := Archive(ctx, opts.StateDir, dir, 1); err != nil {
				t.Errorf("Archive: %v", err)
			}
			if st.BoundType != tc.want || st.NCUVersion == "" || st.KernelLaunches != tc.launches {
				t.Errorf("boundType %s, ncuVersion %q, launches %d; want %s, a version, %d launches\n%s",
					st.BoundType, st.NCUVersion, st.KernelLaunches, tc.want, tc.launches, raw)
			}
			if st.BoundTimeShares == nil || profile.ClassifyShares(*st.BoundTimeShares) != st.BoundType {
				t.Errorf("boundType %s is not what the stored shares %+v classify as", st.BoundType, st.BoundTimeShares)
			}
			// ncu writes its table into report.csv or into its log,
			// depending on the version; the profile names what Collect read.
			var names []string
			for _, k := range st.TopKernels {
				names = append(names, k.Name)
			}
			for _, k := range tc.kernels {
				if !slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, k+"(") }) {
					t.Errorf("the profile's top kernels %q do not name kernel %s", names, k)
				}
			}

			if tc.details {
				checkDetails(ctx, t, ncuPath, kernels, tc.job, tc.kernels[0], filepath.Join(out, tc.job+"_details.csv"))
			}
		})
	}
}

// checkDetails runs ncu's default details page on one launch of job, not
// through the shim, keeps its stdout in path and checks that pkg/ncu reads
// it as a details report of the job's kernel.
func checkDetails(ctx context.Context, t *testing.T, ncuPath, kernels, job, kernel, path string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, ncuTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	// As the shim runs it: locking the clocks would change a setting of
	// the GPU that this check must leave alone.
	cmd := exec.CommandContext(ctx, ncuPath, "--csv", "--clock-control", "none", kernels, job)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	writeRecord(t, path, stdout.Bytes())
	if err != nil {
		t.Fatalf("ncu --csv %s: %v\nstdout:\n%s\nstderr:\n%s", job, err, stdout.Bytes(), stderr.Bytes())
	}
	var names []string
	rep, err := ncu.Scan(ctx, bytes.NewReader(stdout.Bytes()), func(l *ncu.Launch) error {
		names = append(names, l.Kernel)
		return nil
	})
	if err != nil {
		t.Fatalf("ncu.Scan of the details page: %v\n%s", err, stdout.Bytes())
	}
	t.Logf("details page: layout %s, %d launches (%d dropped), kernels %q", rep.Layout, rep.Launches, rep.Dropped, names)
	if rep.Layout != ncu.LayoutDetails {
		t.Errorf("layout %s; want %s", rep.Layout, ncu.LayoutDetails)
	}
	if len(names) != 1 || !strings.Contains(names[0], kernel) {
		t.Errorf("kernels %q; want one launch of %s", names, kernel)
	}
}

// copyRecord copies src to dst, if it exists, and returns its content.
func copyRecord(t *testing.T, src, dst string) []byte {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Logf("not recorded: %v", err)
		return nil
	}
	writeRecord(t, dst, data)
	return data
}

func writeRecord(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Errorf("recording %s: %v", path, err)
	}
}
