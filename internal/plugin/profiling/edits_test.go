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
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

const testClaimUID = "0b6c9f1e-7a53-4c55-9d1e-2f4a8c3b1d20"

const defaultMetricList = "sm__throughput.avg.pct_of_peak_sustained_elapsed," +
	"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed," +
	"gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed," +
	"lts__throughput.avg.pct_of_peak_sustained_elapsed," +
	"sm__warps_active.avg.pct_of_peak_sustained_active," +
	"launch__waves_per_multiprocessor," +
	"dram__bytes.sum," +
	"gpu__time_duration.sum," +
	"smsp__sass_thread_inst_executed_op_fadd_pred_on.sum," +
	"smsp__sass_thread_inst_executed_op_fmul_pred_on.sum," +
	"smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"

// fakeHost lays out an ncu install (a shell script answering --version) and
// a shim file, as the plugin would find them on a node.
func fakeHost(t *testing.T) Options {
	t.Helper()
	root := t.TempDir()
	opts := Options{
		StateDir: filepath.Join(root, "state"),
		NCUDir:   filepath.Join(root, "nsight-compute"),
		ShimPath: filepath.Join(root, "lib", ShimName),
	}
	for _, d := range []string{opts.NCUDir, filepath.Dir(opts.ShimPath)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ncu := "#!/bin/sh\necho 'NVIDIA (R) Nsight Compute Command Line Profiler'\necho 'Version 2025.2.1.0 (build 1) (public-release)'\n"
	if err := os.WriteFile(filepath.Join(opts.NCUDir, "ncu"), []byte(ncu), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(opts.ShimPath, []byte("not a library"), 0o644); err != nil {
		t.Fatal(err)
	}
	return opts
}

func TestPrepareArgs(t *testing.T) {
	tests := map[string]struct {
		cfg  gpuv1alpha1.GpuProfiling
		want []string
	}{
		"defaults": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics", defaultMetricList, "--launch-count", "1"},
		},
		"basic set means Prism's metrics": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true, Set: gpuv1alpha1.BasicProfilingSet, LaunchCount: ptr.To[int32](1)},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics", defaultMetricList, "--launch-count", "1"},
		},
		"custom set keeps Prism's metrics": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true, Set: gpuv1alpha1.RooflineProfilingSet},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--set", "roofline", "--metrics", defaultMetricList, "--launch-count", "1"},
		},
		"custom metrics get the required ones": {
			cfg: gpuv1alpha1.GpuProfiling{Enabled: true, Metrics: []string{"l1tex__throughput.avg.pct_of_peak_sustained_active", "gpu__time_duration.sum"}},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics",
				"l1tex__throughput.avg.pct_of_peak_sustained_active,gpu__time_duration.sum," +
					"sm__throughput.avg.pct_of_peak_sustained_elapsed,gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
				"--launch-count", "1"},
		},
		"launch count": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true, LaunchCount: ptr.To[int32](250)},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics", defaultMetricList, "--launch-count", "250"},
		},
		"kernel name": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true, KernelFilter: "vectorAdd"},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics", defaultMetricList, "--launch-count", "1", "--kernel-name", "vectorAdd"},
		},
		"kernel regex": {
			cfg:  gpuv1alpha1.GpuProfiling{Enabled: true, KernelFilter: "regex:gemm.+f16", LaunchCount: ptr.To[int32](3)},
			want: []string{"--csv", "--page", "raw", "--clock-control", "none", "--metrics", defaultMetricList, "--launch-count", "3", "--kernel-name", "regex:gemm.+f16"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			opts := fakeHost(t)
			edits, err := Prepare(ctx, opts, testClaimUID, &tc.cfg)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			dir := ClaimDir(opts.StateDir, testClaimUID)
			data, err := os.ReadFile(filepath.Join(dir, ArgsFile))
			if err != nil {
				t.Fatal(err)
			}
			// One argument per line, nothing else: the shim passes each
			// line to execv as one argument.
			if got, want := string(data), strings.Join(tc.want, "\n")+"\n"; got != want {
				t.Errorf("args file:\ngot:\n%s\nwant:\n%s", got, want)
			}
			want := &cdispec.ContainerEdits{
				Env: []string{
					"PRISM_NCU=/opt/prism/ncu/ncu",
					"PRISM_NCU_ARGS_FILE=/var/run/prism/profile/ncu.args",
					"PRISM_PROFILE_DIR=/var/run/prism/profile",
				},
				Mounts: []*cdispec.Mount{
					{HostPath: opts.NCUDir, ContainerPath: "/opt/prism/ncu", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "rbind"}},
					{HostPath: opts.ShimPath, ContainerPath: "/opt/prism/lib/libprism-profile.so", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"}},
					{HostPath: filepath.Join(opts.StateDir, "profiles", "ld.so.preload"), ContainerPath: "/etc/ld.so.preload", Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"}},
					{HostPath: dir, ContainerPath: "/var/run/prism/profile", Type: "bind", Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}},
				},
			}
			if !reflect.DeepEqual(want, edits) {
				t.Errorf("edits:\ngot:  %s\nwant: %s", toJSON(t, edits), toJSON(t, want))
			}
			st, err := os.Stat(dir)
			if err != nil {
				t.Fatal(err)
			}
			if st.Mode().Perm() != 0o777 {
				t.Errorf("profile directory mode %v, want 0777 so any container user can write", st.Mode().Perm())
			}
			parent, err := os.Stat(filepath.Dir(dir))
			if err != nil || parent.Mode().Perm() != 0o700 {
				t.Errorf("profiles directory: %v, %v; want mode 0700 so that no other host user reaches the world-writable claim directories", parent.Mode().Perm(), err)
			}
			// The loader preloads what the list names on top of the
			// workload's own LD_PRELOAD, which no edit may set.
			list, err := os.ReadFile(filepath.Join(opts.StateDir, "profiles", "ld.so.preload"))
			if err != nil || string(list) != "/opt/prism/lib/libprism-profile.so\n" {
				t.Errorf("preload list: %q, %v; want the shim's container path alone", list, err)
			}
			version, err := os.ReadFile(filepath.Join(dir, VersionFile))
			if err != nil || !strings.Contains(string(version), "Version 2025.2.1.0") {
				t.Errorf("ncu version not recorded: %q, %v", version, err)
			}
		})
	}
}

func TestPrepareRefuses(t *testing.T) {
	tests := map[string]struct {
		cfg         *gpuv1alpha1.GpuProfiling
		uid         string
		breakHost   func(Options)
		wantErr     string
		unavailable bool
	}{
		"shell metacharacters in the kernel filter": {
			cfg:     &gpuv1alpha1.GpuProfiling{Enabled: true, KernelFilter: "x;rm -rf /"},
			wantErr: "invalid kernel filter",
		},
		"filter that looks like an option": {
			cfg:     &gpuv1alpha1.GpuProfiling{Enabled: true, KernelFilter: "--export=/tmp/x"},
			wantErr: "invalid kernel filter",
		},
		"metric with a newline": {
			cfg:     &gpuv1alpha1.GpuProfiling{Enabled: true, Metrics: []string{"dram__bytes.sum\n--export"}},
			wantErr: "invalid metric name",
		},
		"launch count out of range": {
			cfg:     &gpuv1alpha1.GpuProfiling{Enabled: true, LaunchCount: ptr.To[int32](0)},
			wantErr: "launch count 0",
		},
		"claim UID with a path": {
			cfg:     &gpuv1alpha1.GpuProfiling{Enabled: true},
			uid:     "../../etc",
			wantErr: "invalid claim UID",
		},
		"no ncu on the node": {
			cfg:         &gpuv1alpha1.GpuProfiling{Enabled: true},
			breakHost:   func(o Options) { os.Remove(filepath.Join(o.NCUDir, "ncu")) },
			wantErr:     "ncu",
			unavailable: true,
		},
		"no shim on the node": {
			cfg:         &gpuv1alpha1.GpuProfiling{Enabled: true},
			breakHost:   func(o Options) { os.Remove(o.ShimPath) },
			wantErr:     ShimName,
			unavailable: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			opts := fakeHost(t)
			if tc.breakHost != nil {
				tc.breakHost(opts)
			}
			uid := tc.uid
			if uid == "" {
				uid = testClaimUID
			}
			edits, err := Prepare(ctx, opts, uid, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Prepare: got %v, want an error containing %q", err, tc.wantErr)
			}
			if edits != nil {
				t.Errorf("edits returned with an error: %+v", edits)
			}
			if got := errors.Is(err, ErrUnavailable); got != tc.unavailable {
				t.Errorf("errors.Is(err, ErrUnavailable) = %v, want %v", got, tc.unavailable)
			}
			if _, err := os.Stat(filepath.Join(ClaimDir(opts.StateDir, uid), ArgsFile)); err == nil {
				t.Errorf("args file written although prepare failed")
			}
		})
	}
}

func TestPrepareDisabled(t *testing.T) {
	for name, cfg := range map[string]*gpuv1alpha1.GpuProfiling{
		"nil":      nil,
		"disabled": {Enabled: false, KernelFilter: "vectorAdd"},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			opts := fakeHost(t)
			edits, err := Prepare(ctx, opts, testClaimUID, cfg)
			if err != nil || edits != nil {
				t.Fatalf("Prepare = %v, %v; want no edits and no error", edits, err)
			}
			if _, err := os.Stat(ClaimDir(opts.StateDir, testClaimUID)); !os.IsNotExist(err) {
				t.Errorf("profile directory created for a claim without profiling: %v", err)
			}
		})
	}
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// jobFor is a report job for a claim of the given UID.
func jobFor(claimUID string) Job {
	return Job{Claim: prismv1alpha1.ClaimReference{Namespace: "ml", Name: "train", UID: types.UID(claimUID)}, Profile: "train"}
}
