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
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"k8s.io/klog/v2/ktesting"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// vectorAdd moves 12 bytes per FP32 add: memory-bound on every GPU.
const vectorAddSource = `#include <cstdio>
__global__ void vectorAdd(const float *a, const float *b, float *c, int n) {
	int i = blockIdx.x * blockDim.x + threadIdx.x;
	if (i < n) c[i] = a[i] + b[i];
}
int main() {
	const int n = 1 << 26;
	float *a, *b, *c;
	cudaMalloc(&a, n * sizeof(float));
	cudaMalloc(&b, n * sizeof(float));
	cudaMalloc(&c, n * sizeof(float));
	cudaMemset(a, 0, n * sizeof(float));
	cudaMemset(b, 0, n * sizeof(float));
	vectorAdd<<<(n + 255) / 256, 256>>>(a, b, c, n);
	cudaError_t err = cudaDeviceSynchronize();
	printf("vectorAdd: %s\n", cudaGetErrorString(err));
	return err == cudaSuccess ? 0 : 1;
}
`

// TestGPUVectorAdd runs a real CUDA program under the shim and the real
// ncu. Run it on a GPU node with: go test -tags gpu ./pkg/profiling/
// (NCU_DIR names the Nsight Compute install directory when ncu is not in
// PATH).
func TestGPUVectorAdd(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	nvcc, err := exec.LookPath("nvcc")
	if err != nil {
		t.Skip("nvcc not found")
	}
	ncuDir := os.Getenv("NCU_DIR")
	if ncuDir == "" {
		ncu, err := exec.LookPath("ncu")
		if err != nil {
			t.Skip("ncu not found; set NCU_DIR")
		}
		if ncu, err = filepath.EvalSymlinks(ncu); err != nil {
			t.Fatal(err)
		}
		ncuDir = filepath.Dir(ncu)
	}
	var pe *PermissionError
	if err := CheckPermissions("/proc"); errors.As(err, &pe) {
		t.Skipf("cannot profile here: %v", err)
	} else if err != nil {
		t.Fatalf("CheckPermissions: %v", err)
	}
	shim := buildShim(ctx, t)

	work := t.TempDir()
	src := filepath.Join(work, "vectoradd.cu")
	if err := os.WriteFile(src, []byte(vectorAddSource), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(work, "vectoradd")
	if out, err := exec.Command(nvcc, "-O2", "-o", bin, src).CombinedOutput(); err != nil {
		t.Fatalf("nvcc: %v\n%s", err, out)
	}

	opts := Options{StateDir: filepath.Join(work, "state"), NCUDir: ncuDir, ShimPath: shim}
	if os.Geteuid() == 0 {
		// ncu writes its report into a tmpfs, as on a node.
		opts.DirSize = DefaultDirSize
		unmountAtCleanup(t, opts.StateDir)
	}
	edits, err := Prepare(ctx, opts, testClaimUID, &gpuv1alpha1.GpuProfiling{Enabled: true})
	if err != nil {
		t.Fatalf("Prepare: %v", err)
	}
	cmd := exec.Command(bin)
	cmd.Env = containerEnv(t, edits, "HOME="+work)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("vectoradd under the shim: %v\n%s", err, out)
	}
	dir, err := Detach(opts.StateDir, jobFor(testClaimUID))
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, outDir, ReportFile))
	st, err := Collect(ctx, dir, profile.Options{})
	if err != nil {
		ncuLog, _ := os.ReadFile(filepath.Join(dir, outDir, LogFile))
		t.Fatalf("Collect: %v\nncu.log:\n%s", err, ncuLog)
	}
	if err := Archive(ctx, opts.StateDir, dir, 1); err != nil {
		t.Errorf("Archive: %v", err)
	}
	if st.BoundType != prismv1alpha1.BoundTypeMemoryBound || st.NCUVersion == "" || st.KernelLaunches != 1 {
		t.Errorf("boundType %s, ncuVersion %q, launches %d; want MemoryBound, a version, 1 launch\n%s",
			st.BoundType, st.NCUVersion, st.KernelLaunches, raw)
	}
}
