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

package mpstest_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// TestProcessesFindsADaemonByItsPipeDirectory: a control daemon is found
// by the pipe directory it serves while it runs, and not once it quit.
func TestProcessesFindsADaemonByItsPipeDirectory(t *testing.T) {
	root, _ := mpstest.DriverRoot(t)
	pipe := filepath.Join(t.TempDir(), "pipe")
	env := append(os.Environ(), "CUDA_MPS_PIPE_DIRECTORY="+pipe, "CUDA_MPS_LOG_DIRECTORY="+t.TempDir())
	control := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(mpstest.Binary(root), args...)
		cmd.Env, cmd.Stdin = env, strings.NewReader(stdin)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("nvidia-cuda-mps-control %v: %v: %s", args, err, out)
		}
	}
	ours := func(p mpstest.Process) bool { return p.PipeDir == pipe }
	control("", "-d")
	running := mpstest.Processes(ours)
	if len(running) != 1 || filepath.Base(running[0].Argv0) != "nvidia-cuda-mps-control" {
		t.Fatalf("processes serving %s while the daemon runs: %+v, want the daemon", pipe, running)
	}
	control("quit\n")
	deadline := time.Now().Add(10 * time.Second)
	for left := mpstest.Processes(ours); len(left) > 0; left = mpstest.Processes(ours) {
		if time.Now().After(deadline) {
			t.Fatalf("processes serving %s after quit (-want +got):\n%s", pipe, cmp.Diff([]mpstest.Process(nil), left))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestGPUClientLines(t *testing.T) {
	rep := mpstest.ParseGPUClientLine(`{"pid":7,"sm_count":52,"allocs":[{"bytes":1024},{"bytes":2048,"error":"cudaErrorMemoryAllocation"}]}`)
	if !(rep.PID == 7 && rep.SMCount == 52) || rep.AllocError(1024) != "" || rep.AllocError(2048) != "cudaErrorMemoryAllocation" || rep.AllocError(4096) != "not tried" {
		t.Errorf("parsed report %+v", rep)
	}
	if rep := mpstest.ParseGPUClientLine("Segmentation fault"); rep.OK() || !strings.Contains(rep.Error, "unreadable line") {
		t.Errorf("a line that is no report: %+v, want its Error", rep)
	}
	for line, want := range map[string]string{`{"pid":7,"after_hold":"cudaErrorMpsRpcFailure"}`: "cudaErrorMpsRpcFailure", `{"pid":7}`: "", "garbage": ""} {
		if got := mpstest.AfterHoldOf(line); got != want {
			t.Errorf("AfterHoldOf(%q) = %q, want %q", line, got, want)
		}
	}
}
