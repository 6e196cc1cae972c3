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
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// buildShim compiles the preload library for a test.
func buildShim(ctx context.Context, t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("gcc"); err != nil && os.Getenv("CC") == "" {
		t.Skip("gcc is not installed: the preload library cannot be compiled")
	}
	path, err := BuildShim(ctx, t.TempDir())
	if err != nil {
		t.Fatalf("BuildShim: %v", err)
	}
	return path
}

// buildFakeNCU builds test/tools/fake-ncu as <dir>/ncu, where Prepare
// expects the launcher of an Nsight Compute install.
func buildFakeNCU(t *testing.T) string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is needed to build fake-ncu: %v", err)
	}
	dir := t.TempDir()
	cmd := exec.Command(goTool, "build", "-o", filepath.Join(dir, "ncu"), "github.com/prismgpu/prism/test/tools/fake-ncu")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building fake-ncu: %v\n%s", err, out)
	}
	return dir
}

// containerEnv applies CDI edits by hand, as far as an unprivileged test
// can: bind mounts are impossible, so every environment value that names a
// container path is rewritten to the host path mounted there. The shim
// takes all its paths from the environment, which makes this faithful.
//
// The preload list cannot be mounted on /etc/ld.so.preload either. The
// loader loads its libraries after those of LD_PRELOAD, and alike, so they
// are appended to the workload's LD_PRELOAD (from extra) instead.
func containerEnv(t *testing.T, edits *cdispec.ContainerEdits, extra ...string) []string {
	t.Helper()
	mounts := append([]*cdispec.Mount(nil), edits.Mounts...)
	// The longest container path is the most specific mount.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].ContainerPath) > len(mounts[j].ContainerPath) })
	hostPath := func(k, v string) string {
		for _, m := range mounts {
			if v == m.ContainerPath || strings.HasPrefix(v, m.ContainerPath+"/") {
				v = m.HostPath + strings.TrimPrefix(v, m.ContainerPath)
				break
			}
		}
		if strings.HasPrefix(v, "/opt/prism") || strings.HasPrefix(v, "/var/run/prism") {
			t.Fatalf("%s=%s names a container path that no mount provides", k, v)
		}
		return v
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin"}
	for _, kv := range edits.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "LD_PRELOAD" {
			t.Fatalf("the edits set %s, which replaces the workload's own preload", kv)
		}
		env = append(env, k+"="+hostPath(k, v))
	}
	var preload []string
	for _, kv := range extra {
		if k, v, _ := strings.Cut(kv, "="); k == "LD_PRELOAD" {
			preload = append(preload, v)
			continue
		}
		env = append(env, kv)
	}
	for _, m := range mounts {
		if m.ContainerPath != ContainerPreloadList {
			continue
		}
		list, err := os.ReadFile(m.HostPath)
		if err != nil {
			t.Fatal(err)
		}
		for _, lib := range strings.Fields(string(list)) {
			preload = append(preload, hostPath(ContainerPreloadList, lib))
		}
	}
	if len(preload) > 0 {
		env = append(env, "LD_PRELOAD="+strings.Join(preload, " "))
	}
	return env
}

// buildPreloadMarker compiles a library that stands for a workload's own
// preload (jemalloc, say): every program that loads it appends
// "<program>: profiled" or "<program>: not profiled" to $PRELOAD_OUT.
func buildPreloadMarker(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	out := filepath.Join(t.TempDir(), "libmarker.so")
	cmd := exec.Command(cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", out, filepath.Join("testdata", "preload-marker.c"))
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("compiling the preload marker: %v\n%s", err, msg)
	}
	return out
}

// invocations splits fake-ncu's marker file into one argv per run.
func invocations(t *testing.T, marker string) [][]string {
	t.Helper()
	data, err := os.ReadFile(marker)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var out [][]string
	var cur []string
	for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
		if line == "--end--" {
			out = append(out, cur)
			cur = nil
			continue
		}
		cur = append(cur, line)
	}
	return out
}

func readArgs(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, ArgsFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(data), "\n"), "\n")
}

func TestShimEndToEnd(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	shim := buildShim(ctx, t)
	ncuDir := buildFakeNCU(t)

	// The workload re-arms LD_PRELOAD for a child to prove that the guard,
	// not only the removal of LD_PRELOAD, stops a second profile.
	const script = `echo ran >> "$OUT"; echo workload-stdout; LD_PRELOAD="$SHIM" /bin/sh -c 'echo child >> "$OUT"'; exit 3`

	tests := map[string]struct {
		cfg gpuv1alpha1.GpuProfiling
		// env is added to the container's environment.
		env []string
		// command runs in the container; its first process loads the shim.
		command []string
		// runs is how often the container is started (restarts).
		runs int
		// ownPreload gives the workload an LD_PRELOAD of its own.
		ownPreload bool
		// wantPreloaded is what the workload's own preload recorded.
		wantPreloaded string

		wantOut      string
		wantProfiled bool
		// wantTarget is the program ncu was asked to start and its
		// arguments, when profiled.
		wantTarget []string
		// wantShimErrors is the number of lines in profile-error.txt.
		wantShimErrors int
		wantReason     Reason
		wantDetail     string
	}{
		"entrypoint runs once under ncu": {
			cfg:          gpuv1alpha1.GpuProfiling{Enabled: true, KernelFilter: "vectorAdd", LaunchCount: new(int32(2))},
			command:      []string{"/bin/sh", "-c", script},
			runs:         1,
			wantOut:      "ran\nchild\n",
			wantProfiled: true,
			wantTarget:   []string{"/bin/sh", "-c", script},
		},
		"the workload's own LD_PRELOAD reaches the profiled program": {
			cfg:          gpuv1alpha1.GpuProfiling{Enabled: true},
			command:      []string{"/bin/sh", "-c", script},
			runs:         1,
			ownPreload:   true,
			wantOut:      "ran\nchild\n",
			wantProfiled: true,
			wantTarget:   []string{"/bin/sh", "-c", script},
			// The child re-arms LD_PRELOAD with the shim alone.
			wantPreloaded: "sh: profiled\n",
		},
		"a restarted container is not profiled again": {
			cfg:          gpuv1alpha1.GpuProfiling{Enabled: true},
			command:      []string{"/bin/sh", "-c", script},
			runs:         2,
			wantOut:      "ran\nchild\nran\nchild\n",
			wantProfiled: true,
			wantTarget:   []string{"/bin/sh", "-c", script},
		},
		"PRISM_PROFILE_MATCH skips a wrapper": {
			cfg:          gpuv1alpha1.GpuProfiling{Enabled: true},
			env:          []string{"PRISM_PROFILE_MATCH=env"},
			command:      []string{"/bin/sh", "-c", `echo wrapper >> "$OUT"; exec env sh -c 'echo ran >> "$OUT"; exit 3'`},
			runs:         1,
			wantOut:      "wrapper\nran\n",
			wantProfiled: true,
			wantTarget:   []string{"env", "sh", "-c", `echo ran >> "$OUT"; exit 3`},
		},
		"missing ncu leaves the workload alone": {
			cfg:            gpuv1alpha1.GpuProfiling{Enabled: true},
			env:            []string{EnvNCU + "=/nonexistent/ncu"},
			command:        []string{"/bin/sh", "-c", script},
			runs:           1,
			wantOut:        "ran\nchild\n",
			wantShimErrors: 1,
			wantReason:     ReasonProfilerFailed,
			wantDetail:     "ncu is not executable",
		},
		"ncu without permission": {
			cfg:          gpuv1alpha1.GpuProfiling{Enabled: true},
			env:          []string{"PRISM_FAKE_NCU_ERROR=ERR_NVGPUCTRPERM"},
			command:      []string{"/bin/sh", "-c", script},
			runs:         1,
			wantOut:      "ran\nchild\n",
			wantProfiled: true,
			wantTarget:   []string{"/bin/sh", "-c", script},
			wantReason:   ReasonProfilerFailed,
			wantDetail:   "CAP_SYS_ADMIN",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			root := t.TempDir()
			opts := Options{StateDir: filepath.Join(root, "state"), NCUDir: ncuDir, ShimPath: shim}
			edits, err := Prepare(ctx, opts, testClaimUID, &tc.cfg)
			if err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			dir := ClaimDir(opts.StateDir, testClaimUID)
			out := filepath.Join(root, "out")
			marker := filepath.Join(root, "fake-ncu.marker")
			extra := append([]string{"OUT=" + out, "SHIM=" + shim, "PRISM_FAKE_NCU_MARKER=" + marker}, tc.env...)
			preloaded := filepath.Join(root, "preloaded")
			if tc.ownPreload {
				extra = append(extra, "LD_PRELOAD="+buildPreloadMarker(t), "PRELOAD_OUT="+preloaded)
			}
			env := containerEnv(t, edits, extra...)

			for range tc.runs {
				cmd := exec.Command(tc.command[0], tc.command[1:]...)
				cmd.Env = env
				output, err := cmd.CombinedOutput()
				var exit *exec.ExitError
				if !errors.As(err, &exit) || exit.ExitCode() != 3 {
					t.Fatalf("workload: got %v, want exit status 3 (the profiler must pass it on); output:\n%s", err, output)
				}
			}

			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.wantOut {
				t.Errorf("workload output %q, want %q", got, tc.wantOut)
			}
			if tc.ownPreload {
				// fake-ncu is a static Go program; the first process is
				// replaced by ncu before any constructor after the shim's.
				got, _ := os.ReadFile(preloaded)
				if string(got) != tc.wantPreloaded {
					t.Errorf("the workload's own preload recorded %q, want %q", got, tc.wantPreloaded)
				}
			}

			runs := invocations(t, marker)
			if !tc.wantProfiled {
				if len(runs) != 0 {
					t.Fatalf("ncu ran %d times, want never: %q", len(runs), runs)
				}
			} else {
				if len(runs) != 1 {
					t.Fatalf("ncu ran %d times, want exactly once: %q", len(runs), runs)
				}
				want := append(readArgs(t, dir), "--log-file", filepath.Join(dir, LogFile))
				if len(tc.wantTarget) > 0 && tc.wantTarget[0] == "env" {
					// Found in PATH; where depends on the distribution.
					target := runs[0][len(want)]
					if filepath.Base(target) != "env" || !filepath.IsAbs(target) {
						t.Errorf("target %q, want env resolved from PATH", target)
					}
					want = append(want, target)
					want = append(want, tc.wantTarget[1:]...)
				} else {
					want = append(want, tc.wantTarget...)
				}
				if !reflect.DeepEqual(runs[0], want) {
					t.Errorf("ncu argv:\ngot:  %q\nwant: %q", runs[0], want)
				}
				if args := readArgs(t, dir); len(args) < 3 || args[0] != "--csv" {
					t.Errorf("args file does not hold the configured arguments: %q", args)
				}
				log, err := os.ReadFile(filepath.Join(dir, LogFile))
				if err != nil || !strings.Contains(string(log), "==PROF== Connected to process") {
					t.Errorf("ncu.log: %q, %v; want ==PROF== lines", log, err)
				}
			}

			// One line per process that gave up: the guard must stop the
			// child from trying again.
			shimErrors, _ := os.ReadFile(filepath.Join(dir, ErrorFile))
			if got := strings.Count(string(shimErrors), "\n"); got != tc.wantShimErrors {
				t.Errorf("%s has %d lines, want %d:\n%s", ErrorFile, got, tc.wantShimErrors, shimErrors)
			}

			detached, err := Detach(opts.StateDir, jobFor(testClaimUID))
			if err != nil {
				t.Fatal(err)
			}
			raw, _ := os.ReadFile(filepath.Join(detached, outDir, ReportFile))
			st, err := Collect(ctx, detached, profile.Options{})
			if tc.wantReason != "" {
				var ce *CollectError
				if !errors.As(err, &ce) || ce.Reason != tc.wantReason || !strings.Contains(ce.Detail, tc.wantDetail) {
					t.Fatalf("Collect: got %v, want %s containing %q", err, tc.wantReason, tc.wantDetail)
				}
				return
			}
			if err != nil {
				t.Fatalf("Collect: %v", err)
			}
			// The workload's stdout shares the report file with ncu's CSV;
			// the parser skips it.
			if !strings.Contains(string(raw), "workload-stdout") && tc.wantTarget[0] != "env" {
				t.Errorf("report lacks the workload's stdout: %q", raw)
			}
			if st.BoundType != prismv1alpha1.BoundTypeMemoryBound || st.NCUVersion != "2025.3.1.0" {
				t.Errorf("status: boundType %s, ncuVersion %q; want MemoryBound from fake-ncu's vector-add report, 2025.3.1.0", st.BoundType, st.NCUVersion)
			}
		})
	}
}
