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

// Package mpstest builds the stand-in nvidia-cuda-mps-control
// (test/tools/fake-mps-control) for tests, runs it as a CUDA client, and
// reads what it recorded.
package mpstest

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// Entry is one line that the stand-in records.
type Entry struct {
	Role           string   `json:"role"`
	Event          string   `json:"event"`
	Args           []string `json:"args,omitempty"`
	Command        string   `json:"command,omitempty"`
	PID            int      `json:"pid"`
	PipeDir        string   `json:"pipeDir"`
	VisibleDevices string   `json:"visibleDevices,omitempty"`

	// The fields below are set by the events that model MPS servers and
	// CUDA clients: "server-start" and "server-exit" of the daemon, and
	// "connect", "wait", "attach" and "exit" of a CUDA client.

	// UID is the user a server runs as, or a CUDA client's effective UID.
	// A pointer, as root's 0 is a UID.
	UID *int `json:"uid,omitempty"`
	// Server is the server's ID, the PID that get_server_list prints.
	Server string `json:"server,omitempty"`
	// ActiveThreadPercentage is a server's limit when it starts, or a
	// client's effective one when it attaches.
	ActiveThreadPercentage float64 `json:"activeThreadPercentage,omitempty"`
	// PinnedMemLimitBytes is the same for device 0's pinned memory; 0 is
	// no limit.
	PinnedMemLimitBytes int64 `json:"pinnedMemLimitBytes,omitempty"`
	// Waited says that a client waited for the server of another UID to
	// exit.
	Waited bool   `json:"waited,omitempty"`
	Error  string `json:"error,omitempty"`
}

// DriverRoot builds the stand-in as <root>/usr/bin/nvidia-cuda-mps-control
// in a temporary driver root and returns the root. It also makes the
// stand-in record to a file of the test's, returned second, through
// FAKE_MPS_CONTROL_RECORD (so the test may not run in parallel).
//
// Every user may run the binary and append to the record, as MPS servers
// and CUDA clients run as the users of the workloads, not as the test.
func DriverRoot(t *testing.T) (root, record string) {
	t.Helper()
	root = OpenTempDir(t)
	if err := Build(Binary(root)); err != nil {
		t.Fatal(err)
	}
	record = NewRecord(t)
	t.Setenv("FAKE_MPS_CONTROL_RECORD", record)
	return root, record
}

// NewRecord makes an empty record file that every user may append to,
// for FAKE_MPS_CONTROL_RECORD.
func NewRecord(t *testing.T) string {
	t.Helper()
	record := filepath.Join(OpenTempDir(t), "fake-mps-control.log")
	if err := os.WriteFile(record, nil, 0o666); err != nil {
		t.Fatal(err)
	}
	// The umask must not narrow it.
	if err := os.Chmod(record, 0o666); err != nil {
		t.Fatal(err)
	}
	return record
}

// controlBinary is the name of NVIDIA's control program, which the
// stand-in takes.
const controlBinary = "nvidia-cuda-mps-control"

// Binary is where DriverRoot puts the stand-in in a driver root.
func Binary(driverRoot string) string {
	return filepath.Join(driverRoot, "usr", "bin", controlBinary)
}

// Build builds the stand-in as bin.
func Build(bin string) error {
	build := exec.Command("go", "build", "-o", bin, "github.com/prismgpu/prism/test/tools/fake-mps-control")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("build stand-in nvidia-cuda-mps-control: %w\n%s", err, out)
	}
	return nil
}

// OpenTempDir is a temporary directory that every user may enter and
// read, removed when the test ends. t.TempDir's are its user's alone, and
// so are their parents.
func OpenTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "mpstest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Read returns what the stand-in recorded in file; nothing if it has not
// run.
func Read(t *testing.T, file string) []Entry {
	t.Helper()
	f, err := os.Open(file)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []Entry
	s := bufio.NewScanner(f)
	for s.Scan() {
		var e Entry
		if err := json.Unmarshal(s.Bytes(), &e); err != nil {
			t.Fatalf("%s: %v: %s", file, err, s.Text())
		}
		out = append(out, e)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// UnmountAtCleanup unmounts, when the test ends, what is still mounted in
// or under dir: the tmpfs of a pipe directory whose daemon the test left
// running, which would keep its temporary directory from being removed.
// Nothing is mounted where the plugin may not mount, or where its mounts
// would not reach the host.
func UnmountAtCleanup(t *testing.T, dir string) {
	t.Helper()
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, dir) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s left by the test: %v", m, err)
			}
		}
	})
}

// mountsUnder lists the mount points in and under dir, deepest first.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(string(raw), "\n") {
		// ID parent major:minor root mount-point ...
		fields := strings.Fields(line)
		if len(fields) < 5 {
			continue
		}
		if p := fields[4]; p == dir || strings.HasPrefix(p, dir+"/") {
			out = append([]string{p}, out...)
		}
	}
	return out
}
