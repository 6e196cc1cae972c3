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
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// fixture reads a recorded report from pkg/ncu's test data or this
// package's.
func fixture(t *testing.T, name string) []byte {
	t.Helper()
	path := filepath.Join("testdata", name)
	if _, err := os.Stat(path); err != nil {
		path = filepath.Join("..", "ncu", "testdata", name)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestCollect(t *testing.T) {
	version := "NVIDIA (R) Nsight Compute Command Line Profiler\nVersion 2025.2.1.0 (build 1) (public-release)\n"
	tests := map[string]struct {
		// files maps file names in the claim directory to fixture names,
		// or to literal content when prefixed with "=".
		files      map[string]string
		wantReason Reason
		wantDetail string
		// wantReport is a substring of the returned report.
		wantReport []string
	}{
		"nothing collected": {
			wantReason: ReasonReportMissing,
			wantDetail: "did not run under the profiler",
		},
		"empty report": {
			files:      map[string]string{ReportFile: "=", LogFile: "===PROF== Disconnected from process 1\n"},
			wantReason: ReasonReportMissing,
			wantDetail: "ncu.log ends with: ==PROF== Disconnected",
		},
		"garbled report": {
			files:      map[string]string{ReportFile: "garbled.csv"},
			wantReason: ReasonReportUnparseable,
			wantDetail: "parsing report.csv",
		},
		"shim could not start ncu": {
			files:      map[string]string{ErrorFile: "=prism-profile: pid 7: ncu is not executable, running without the profiler: /opt/prism/ncu/ncu: No such file or directory\n"},
			wantReason: ReasonProfilerFailed,
			wantDetail: "/opt/prism/ncu/ncu: No such file or directory",
		},
		"no permission for the counters": {
			files:      map[string]string{ReportFile: "=", LogFile: "ncu-perm.log"},
			wantReason: ReasonProfilerFailed,
			wantDetail: "NVreg_RestrictProfilingToAdminUsers=0",
		},
		"raw report with version": {
			files:      map[string]string{ReportFile: "vectoradd_raw.csv", VersionFile: "=" + version, LogFile: "===PROF== Disconnected\n"},
			wantReport: []string{"Version 2025.2.1.0", `"vectorAdd(const float *`},
		},
		"details report": {
			files:      map[string]string{ReportFile: "fmaloop_details.csv"},
			wantReport: []string{`"fmaLoop`},
		},
		"report printed into the log": {
			files:      map[string]string{ReportFile: "=", LogFile: "tinygrid_raw.csv"},
			wantReport: []string{`"tinyKernel`},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			state := t.TempDir()
			dir := ClaimDir(state, testClaimUID)
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			for file, src := range tc.files {
				data := []byte(strings.TrimPrefix(src, "="))
				if !strings.HasPrefix(src, "=") {
					data = fixture(t, src)
				}
				if err := os.WriteFile(filepath.Join(dir, file), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			report, _, err := Collect(ctx, state, testClaimUID)
			if tc.wantReason != "" {
				var ce *CollectError
				if !errors.As(err, &ce) {
					t.Fatalf("Collect: got %v, want a *CollectError", err)
				}
				if ce.Reason != tc.wantReason || !strings.Contains(ce.Error(), tc.wantDetail) {
					t.Errorf("Collect: got %s %q, want %s containing %q", ce.Reason, ce.Error(), tc.wantReason, tc.wantDetail)
				}
				if report != nil {
					t.Errorf("report returned with an error")
				}
				return
			}
			if err != nil {
				t.Fatalf("Collect: %v", err)
			}
			for _, s := range tc.wantReport {
				if !strings.Contains(string(report), s) {
					t.Errorf("report lacks %q:\n%s", s, report)
				}
			}
		})
	}
}

func TestCollectTail(t *testing.T) {
	long := strings.Repeat("==PROF== noise\n", 1000) + "==ERROR== the actual reason\n"
	got := tail([]byte(long))
	if len(got) > maxTail+3 || !strings.HasSuffix(got, "==ERROR== the actual reason") || !strings.HasPrefix(got, "...==PROF==") {
		t.Errorf("tail kept %d bytes: %q...", len(got), got[:min(len(got), 40)])
	}
}
