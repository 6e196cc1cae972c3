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
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// watchOpens watches the files of dir for opens, and returns a function
// that names those opened since. Opening by O_PATH is not an open for
// inotify, and runs no driver code; opening to read is, and does.
func watchOpens(t *testing.T, dir string) func() map[string]bool {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, err := unix.InotifyAddWatch(fd, dir, unix.IN_OPEN); err != nil {
		t.Fatal(err)
	}
	return func() map[string]bool {
		opened := map[string]bool{}
		buf := make([]byte, 64<<10)
		for {
			n, err := unix.Read(fd, buf)
			if n <= 0 || err != nil {
				return opened
			}
			for off := 0; off+unix.SizeofInotifyEvent <= n; {
				ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
				name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
				opened[string(bytes.TrimRight(name, "\x00"))] = true
				off += unix.SizeofInotifyEvent + int(ev.Len)
			}
		}
	}
}

// fixture reads a recorded report from pkg/ncu's test data or this
// package's.
func fixture(t *testing.T, name string) []byte {
	t.Helper()
	path := filepath.Join("testdata", name)
	if _, err := os.Stat(path); err != nil {
		path = filepath.Join("..", "..", "..", "pkg", "ncu", "testdata", name)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// secret stands for a host file the plugin can read and the tenant must
// not: quoted, so that it would pass for CSV if it were ever read.
const secret = `"-----BEGIN EC PRIVATE KEY-----","MHcCAQEEIBkg4LVWM9nuwNSk3yMrpmO5"`

// entry is what a test puts in the claim directory under one name.
type entry struct {
	fixture string // a file from testdata
	content string // a file with this content
	size    int64  // a sparse file of this size
	symlink bool   // a symbolic link to a secret outside the directory
	fifo    bool
	dir     bool
	// device is a character device node, the kernel's null device: a
	// tenant with CAP_MKNOD could make one of /dev/watchdog, which arms a
	// reboot when opened.
	device bool
}

func (e entry) create(t *testing.T, path string) {
	t.Helper()
	var err error
	switch {
	case e.fixture != "":
		err = os.WriteFile(path, fixture(t, e.fixture), 0o644)
	case e.size > 0:
		err = os.WriteFile(path, nil, 0o644)
		if err == nil {
			err = os.Truncate(path, e.size)
		}
	case e.symlink:
		outside := filepath.Join(t.TempDir(), "kubelet-client-current.pem")
		if err = os.WriteFile(outside, []byte(secret+"\n"), 0o600); err == nil {
			err = os.Symlink(outside, path)
		}
	case e.fifo:
		err = syscall.Mkfifo(path, 0o644)
	case e.dir:
		err = os.Mkdir(path, 0o755)
	case e.device:
		if os.Geteuid() != 0 {
			t.Skip("making a device node needs root")
		}
		err = unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	default:
		err = os.WriteFile(path, []byte(e.content), 0o644)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func TestCollect(t *testing.T) {
	version := "NVIDIA (R) Nsight Compute Command Line Profiler\nCopyright (c) 2018-2025 NVIDIA Corporation\nVersion 2025.3.1.0 (build 36398880) (public-release)\n"
	tests := map[string]struct {
		files      map[string]entry
		wantReason Reason
		wantDetail string
		// wantKernel begins the name of the report's top kernel,
		// wantVersion is the ncu version it records, and wantFile is the
		// file it came from.
		wantKernel  string
		wantVersion string
		wantFile    string
	}{
		"nothing collected": {
			wantReason: ReasonReportMissing,
			wantDetail: "did not run under the profiler",
		},
		"empty report": {
			files:      map[string]entry{ReportFile: {}, LogFile: {content: "==PROF== Disconnected from process 1\n"}},
			wantReason: ReasonReportMissing,
			wantDetail: "neither report.csv (0 bytes) nor ncu.log (37 bytes) holds an ncu CSV table",
		},
		"garbled report": {
			files:      map[string]entry{ReportFile: {fixture: "garbled.csv"}},
			wantReason: ReasonReportUnparseable,
			wantDetail: "report.csv (",
		},
		"shim could not start ncu": {
			files:      map[string]entry{ErrorFile: {content: "prism-profile: pid 7: ncu is not executable, running without the profiler: /opt/prism/ncu/ncu: No such file or directory\n"}},
			wantReason: ReasonProfilerFailed,
			wantDetail: "ran the workload without ncu: ncu is not executable (profile-error.txt, 121 bytes",
		},
		"no permission for the counters": {
			files:      map[string]entry{ReportFile: {}, LogFile: {fixture: "ncu-perm.log"}},
			wantReason: ReasonProfilerFailed,
			wantDetail: "CAP_SYS_ADMIN",
		},
		"raw report with version": {
			files:       map[string]entry{ReportFile: {fixture: "vectoradd_raw.csv"}, VersionFile: {content: version}, LogFile: {content: "==PROF== Disconnected\n"}},
			wantKernel:  "vectorAdd(const float *",
			wantVersion: "2025.3.1.0",
			wantFile:    ReportFile,
		},
		"details report": {
			files:      map[string]entry{ReportFile: {fixture: "fmaloop_details.csv"}},
			wantKernel: "fmaLoop",
			wantFile:   ReportFile,
		},
		"report printed into the log": {
			files:      map[string]entry{ReportFile: {}, LogFile: {fixture: "tinygrid_raw.csv"}},
			wantKernel: "tinyKernel",
			wantFile:   LogFile,
		},

		// The directory is the tenant's: what it holds decides nothing
		// about what the plugin reads.
		"report is a symbolic link to a host file": {
			files:      map[string]entry{ReportFile: {symlink: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "report.csv is a symbolic link",
		},
		"log is a symbolic link to a host file": {
			files:      map[string]entry{ReportFile: {}, LogFile: {symlink: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "ncu.log is a symbolic link",
		},
		"shim error is a symbolic link to a host file": {
			files:      map[string]entry{ErrorFile: {symlink: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "profile-error.txt is a symbolic link",
		},
		"report is a directory": {
			files:      map[string]entry{ReportFile: {dir: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "report.csv is not a regular file (a directory)",
		},
		"report is a device node": {
			files:      map[string]entry{ReportFile: {device: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "report.csv is not a regular file (a device)",
		},
		"report is a FIFO": {
			files:      map[string]entry{ReportFile: {fifo: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "report.csv is not a regular file (a FIFO)",
		},
		"log is a FIFO": {
			files:      map[string]entry{ReportFile: {}, LogFile: {fifo: true}},
			wantReason: ReasonReportRejected,
			wantDetail: "ncu.log is not a regular file (a FIFO)",
		},
		"report larger than the budget": {
			files:      map[string]entry{ReportFile: {size: collectBudget + 1}},
			wantReason: ReasonReportTooLarge,
			wantDetail: "report.csv has at least 67108865 bytes",
		},
		"files together larger than the budget": {
			files:      map[string]entry{ReportFile: {size: collectBudget / 2}, LogFile: {size: collectBudget/2 + 1}},
			wantReason: ReasonReportTooLarge,
			wantDetail: "ncu.log has at least 33554433 bytes, more than the 33554432 bytes left",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			dir := filepath.Join(t.TempDir(), "claim")
			if err := os.MkdirAll(filepath.Join(dir, outDir), 0o777); err != nil {
				t.Fatal(err)
			}
			for file, e := range tc.files {
				e.create(t, filepath.Join(dir, outDir, file))
			}
			opened := watchOpens(t, filepath.Join(dir, outDir))

			// A FIFO used to block Collect for good. The deadline only
			// keeps a regression from hanging the test run; Collect is
			// never waited for on time.
			ctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			type result struct {
				status *prismv1alpha1.WorkloadProfileStatus
				err    error
			}
			done := make(chan result, 1)
			go func() {
				report, err := Collect(ctx, dir, profile.Options{})
				done <- result{report, err}
			}()
			var got result
			select {
			case got = <-done:
			case <-ctx.Done():
				t.Fatalf("Collect did not return: it blocks on what the tenant put in the directory")
			}

			var text string
			if got.err != nil {
				text = got.err.Error()
			}
			if got.status != nil {
				text += fmt.Sprintf("%+v", *got.status)
			}
			for file, e := range tc.files {
				if (e.device || e.fifo) && opened()[file] {
					t.Errorf("Collect opened %s, which is not a regular file, for reading", file)
				}
			}
			if strings.Contains(text, "PRIVATE KEY") || strings.Contains(text, "MHcCAQEE") {
				t.Fatalf("the secret behind a symbolic link reached the result: %q", text)
			}
			if tc.wantReason != "" {
				var ce *CollectError
				if !errors.As(got.err, &ce) {
					t.Fatalf("Collect: got %v, want a *CollectError", got.err)
				}
				if ce.Reason != tc.wantReason || !strings.Contains(ce.Error(), tc.wantDetail) {
					t.Errorf("Collect: got %s %q, want %s containing %q", ce.Reason, ce.Error(), tc.wantReason, tc.wantDetail)
				}
				if got.status != nil {
					t.Errorf("status returned with an error")
				}
				return
			}
			if got.err != nil {
				t.Fatalf("Collect: %v", got.err)
			}
			st := got.status
			if len(st.TopKernels) == 0 || !strings.HasPrefix(st.TopKernels[0].Name, tc.wantKernel) || st.NCUVersion != tc.wantVersion {
				t.Errorf("summary: top kernels %+v, ncu version %q; want %q first, version %q", st.TopKernels, st.NCUVersion, tc.wantKernel, tc.wantVersion)
			}
			source := fixture(t, tc.files[tc.wantFile].fixture)
			sum := sha256.Sum256(source)
			want := prismv1alpha1.ReportDigest{File: tc.wantFile, SHA256: hex.EncodeToString(sum[:]), SizeBytes: int64(len(source))}
			if diff := cmp.Diff(&want, st.Report); diff != "" {
				t.Errorf("status.report (-want +got):\n%s", diff)
			}
		})
	}
}
