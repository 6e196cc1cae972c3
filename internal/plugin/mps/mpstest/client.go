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
	"bufio"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// ClientResult is the line that the stand-in prints as a CUDA client
// (nvidia-cuda-mps-control --cuda-client): what a CUDA program under MPS
// would have got.
type ClientResult struct {
	// MPS is false when the client found no control daemon and ran
	// without MPS, as CUDA does, silently.
	MPS bool `json:"mps"`
	// ServerUID is the UID of the server the client joined.
	ServerUID *int `json:"serverUID,omitempty"`
	// Server is that server's ID, as get_server_list prints it.
	Server string `json:"server,omitempty"`
	// ActiveThreadPercentage is the client's effective limit: the
	// server's, or the client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE where
	// that is lower.
	ActiveThreadPercentage float64 `json:"activeThreadPercentage,omitempty"`
	// PinnedMemLimitBytes is the same for device 0's pinned memory and
	// CUDA_MPS_PINNED_DEVICE_MEM_LIMIT; 0 is no limit.
	PinnedMemLimitBytes int64 `json:"pinnedMemLimitBytes,omitempty"`
	// Waited says that the client waited for the server of another UID
	// to exit.
	Waited bool   `json:"waited,omitempty"`
	Error  string `json:"error,omitempty"`

	// ExitCode is the client's exit status, set by RunClient and
	// Client.Release; it is not printed.
	ExitCode int `json:"-"`
}

// The stand-in CUDA client's exit statuses, besides 0.
const (
	// ExitWaitTimedOut: the server of another UID still had clients when
	// --wait ran out.
	ExitWaitTimedOut = 2
	// ExitNoSharedMemory: the server's file in /dev/shm is not the
	// client's to see, so it cannot reach the server.
	ExitNoSharedMemory = 3
	// ExitOutOfMemory: --alloc is above the effective pinned memory
	// limit.
	ExitOutOfMemory = 4
	// ExitServerFailed: the daemon could not start a server, quit while
	// the client waited, or the server exited under the client.
	ExitServerFailed = 5
)

// Client is the stand-in running as a CUDA client.
type Client struct {
	cmd    *exec.Cmd
	stdout *bufio.Reader
	result *ClientResult
}

// StartClient starts the stand-in bin as a CUDA client with the flags in
// args (--hold, --alloc, --wait). env is its whole environment (nil: the
// test's) and cred, when not nil, the user it runs as. It returns at
// once; Result waits for what the client printed. The client is killed
// when the test ends if it still runs.
func StartClient(t *testing.T, bin string, env []string, cred *syscall.Credential, args ...string) *Client {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--cuda-client"}, args...)...)
	cmd.Env = env
	if cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &testWriter{t: t}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start stand-in CUDA client: %v", err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	return &Client{cmd: cmd, stdout: bufio.NewReader(stdout)}
}

// PID is the client's process ID, as get_client_list prints it.
func (c *Client) PID() int { return c.cmd.Process.Pid }

// Result waits until the client has printed its line and returns it: at
// once for a client that joined a server or failed, after its wait for
// one that waits for a server of another UID.
func (c *Client) Result(t *testing.T) ClientResult {
	t.Helper()
	if c.result != nil {
		return *c.result
	}
	line, err := c.stdout.ReadBytes('\n')
	if err != nil && !(errors.Is(err, io.EOF) && len(line) > 0) {
		t.Fatalf("stand-in CUDA client printed no result: %v", err)
	}
	var r ClientResult
	if err := json.Unmarshal(line, &r); err != nil {
		t.Fatalf("stand-in CUDA client's result %q: %v", line, err)
	}
	c.result = &r
	return r
}

// Release ends the client's --hold early, as the program's exit would,
// waits for it to exit and returns its result with its exit status.
func (c *Client) Release(t *testing.T) ClientResult {
	t.Helper()
	r := c.Result(t)
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("release stand-in CUDA client: %v", err)
	}
	r.ExitCode = c.wait(t)
	return r
}

// wait waits for the client to exit and returns its exit status.
func (c *Client) wait(t *testing.T) int {
	t.Helper()
	// What is left on stdout must be read before Wait closes it.
	_, _ = io.Copy(io.Discard, c.stdout)
	err := c.cmd.Wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatalf("stand-in CUDA client: %v", err)
	}
	return c.cmd.ProcessState.ExitCode()
}

// RunClient runs the stand-in bin as a CUDA client to its end, as
// StartClient starts it, and returns its result with its exit status.
func RunClient(t *testing.T, bin string, env []string, cred *syscall.Credential, args ...string) ClientResult {
	t.Helper()
	c := StartClient(t, bin, env, cred, args...)
	r := c.Result(t)
	r.ExitCode = c.wait(t)
	return r
}

// testWriter logs what the client writes to its standard error.
type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Logf("stand-in CUDA client: %s", p)
	return len(p), nil
}

// SetEnv returns an edit of a client's environment that sets each
// NAME=value of kvs, replacing what it had of that name: a container's
// workload that raises or lowers its MPS limits.
func SetEnv(kvs ...string) func([]string) []string {
	return func(env []string) []string {
		for _, kv := range kvs {
			name, _, _ := strings.Cut(kv, "=")
			env = append(UnsetEnv(name)(env), kv)
		}
		return env
	}
}

// UnsetEnv returns an edit of a client's environment that drops the
// variables named: a workload that unsets its MPS limits.
func UnsetEnv(names ...string) func([]string) []string {
	return func(env []string) []string {
		return slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
			name, _, _ := strings.Cut(kv, "=")
			return slices.Contains(names, name)
		})
	}
}
