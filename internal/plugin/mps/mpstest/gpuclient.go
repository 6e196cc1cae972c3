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

package mpstest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// GPUClientReport is the line prism-mps-client prints
// (hack/gpu-check/mps-client.cu): what a CUDA program saw of its GPU, or
// of its share of one, on a real GPU.
type GPUClientReport struct {
	PID int `json:"pid"`
	UID int `json:"uid"`
	// InitError is CUDA's error where it did not initialise, Error where
	// a call after that failed: "name: message".
	InitError      string     `json:"init_error,omitempty"`
	Error          string     `json:"error,omitempty"`
	InitSeconds    float64    `json:"init_seconds"`
	SMCount        int        `json:"sm_count"`
	MemFreeBytes   int64      `json:"mem_free_bytes"`
	MemTotalBytes  int64      `json:"mem_total_bytes"`
	Launches       int        `json:"launches"`
	KernelSeconds  float64    `json:"kernel_seconds"`
	FlopsPerSecond float64    `json:"flops_per_second"`
	Allocs         []GPUAlloc `json:"allocs"`
}

// GPUAlloc is one allocation the client tried: Error is CUDA's error name
// where it failed, empty where it succeeded.
type GPUAlloc struct {
	Bytes   int64  `json:"bytes"`
	Error   string `json:"error,omitempty"`
	Message string `json:"message,omitempty"`
}

// OK says that the client ran its kernel.
func (c *GPUClientReport) OK() bool {
	return c != nil && c.InitError == "" && c.Error == "" && c.FlopsPerSecond > 0
}

// AllocError is CUDA's error for the allocation of bytes: "" where it
// succeeded, "not tried" where the client did not try it.
func (c *GPUClientReport) AllocError(bytes int64) string {
	for _, a := range c.Allocs {
		if a.Bytes == bytes {
			return a.Error
		}
	}
	return "not tried"
}

// GPUClientOutcome is how one run of prism-mps-client went, as the real
// GPU tests record it beside what they ran it in.
type GPUClientOutcome struct {
	Report *GPUClientReport `json:"report,omitempty"`
	// LineSeconds is how long after its start the client printed its
	// line.
	LineSeconds float64 `json:"line_seconds,omitempty"`
	// AfterHold is CUDA's error name for the kernel a held client ran
	// after its release ("cudaSuccess" where it ran).
	AfterHold string `json:"after_hold,omitempty"`
	// ExitCode is -1 where the test killed it.
	ExitCode int `json:"exit_code"`
	// TimedOut: no line, or no exit, within the time it was given.
	TimedOut bool   `json:"timed_out,omitempty"`
	Stderr   string `json:"stderr,omitempty"`
}

// ParseGPUClientLine reads the client's first line; one that is not its
// report is kept as the report's Error.
func ParseGPUClientLine(line string) *GPUClientReport {
	var rep GPUClientReport
	if err := json.Unmarshal([]byte(line), &rep); err != nil {
		return &GPUClientReport{Error: fmt.Sprintf("unreadable line %q: %v", line, err)}
	}
	return &rep
}

// AfterHoldOf is what a line the client printed after its hold says of
// its last kernel, "" for any other line.
func AfterHoldOf(line string) string {
	var after struct {
		AfterHold string `json:"after_hold"`
	}
	_ = json.Unmarshal([]byte(line), &after)
	return after.AfterHold
}

// ServerBinary is what an MPS control daemon starts for a client's UID.
const ServerBinary = "nvidia-cuda-mps-server"

// Process is a running MPS control daemon or server, as /proc shows it.
type Process struct {
	PID     int    `json:"pid"`
	Argv0   string `json:"argv0"`
	PipeDir string `json:"pipe_dir,omitempty"`
}

// Processes are the MPS control daemons and servers running now (a
// zombie is gone but for its parent's wait) that keep says to keep.
func Processes(keep func(Process) bool) []Process {
	entries, _ := os.ReadDir("/proc")
	var found []Process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		proc := filepath.Join("/proc", e.Name())
		cmdline, _ := os.ReadFile(filepath.Join(proc, "cmdline"))
		argv0, _, _ := bytes.Cut(cmdline, []byte{0})
		if base := filepath.Base(string(argv0)); base != controlBinary && base != ServerBinary {
			continue
		}
		// "pid (comm) S ...": the state follows the last ")".
		stat, _ := os.ReadFile(filepath.Join(proc, "stat"))
		if i := bytes.LastIndexByte(stat, ')'); i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X' {
			continue
		}
		p := Process{PID: pid, Argv0: string(argv0)}
		environ, _ := os.ReadFile(filepath.Join(proc, "environ"))
		for _, kv := range strings.Split(string(environ), "\x00") {
			if v, ok := strings.CutPrefix(kv, "CUDA_MPS_PIPE_DIRECTORY="); ok {
				p.PipeDir = v
			}
		}
		if keep(p) {
			found = append(found, p)
		}
	}
	return found
}
