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
// (test/tools/fake-mps-control) for tests, and reads what it recorded.
package mpstest

import (
	"bufio"
	"encoding/json"
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
}

// DriverRoot builds the stand-in as <root>/usr/bin/nvidia-cuda-mps-control
// in a temporary driver root and returns the root. It also makes the
// stand-in record to a file of the test's, returned second, through
// FAKE_MPS_CONTROL_RECORD (so the test may not run in parallel).
func DriverRoot(t *testing.T) (root, record string) {
	t.Helper()
	root = t.TempDir()
	bin := filepath.Join(root, "usr", "bin", "nvidia-cuda-mps-control")
	build := exec.Command("go", "build", "-o", bin, "github.com/prismgpu/prism/test/tools/fake-mps-control")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build stand-in nvidia-cuda-mps-control: %v\n%s", err, out)
	}
	record = filepath.Join(t.TempDir(), "fake-mps-control.log")
	t.Setenv("FAKE_MPS_CONTROL_RECORD", record)
	return root, record
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
