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

// Command fake-mps-control stands in for nvidia-cuda-mps-control where there
// is no GPU. It records what it is told, one JSON object a line, in
// fake-mps-control.log in CUDA_MPS_LOG_DIRECTORY, or in the file that
// FAKE_MPS_CONTROL_RECORD names (it outlives the directories the plugin
// removes with the daemon), so that tests can assert a daemon's lifecycle:
//
//	{"role":"daemon","event":"start","args":["-f"],"pid":12,"pipeDir":"...","visibleDevices":"GPU-..."}
//	{"role":"client","event":"run","args":[],"pid":13,"pipeDir":"...","visibleDevices":"..."}
//	{"role":"daemon","event":"command","command":"quit","pid":12,...}
//	{"role":"daemon","event":"exit","pid":12,...}
//
// With -f it runs the daemon in the foreground: it makes the "control"
// named pipe in CUDA_MPS_PIPE_DIRECTORY, owned by the user it runs as (root,
// under the plugin) and writable by every user, as clients of any UID must
// reach the daemon, and reads commands from it until "quit" or SIGTERM,
// then removes the pipe if it is still the one it made. With -d it starts
// itself with -f in a session of its own and returns once the daemon
// listens, as the real -d does. Without either it is a client: it copies
// its standard input to a running daemon's control pipe, and fails as the
// real one does when there is none.
//
// The daemon reads the pipe it opened, not the path: once "control" is
// removed, or replaced, no client reaches it, as none reaches the real
// daemon, while it runs on. That is what the plugin's liveness check
// must notice.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

const logName = "fake-mps-control.log"

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stderr))
}

func run(args []string, stdin io.Reader, stderr io.Writer) int {
	pipeDir := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	logDir := envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
	record := func(role, event, command string) {
		e := mpstest.Entry{Role: role, Event: event, Args: args, Command: command, PID: os.Getpid(), PipeDir: pipeDir, VisibleDevices: os.Getenv("CUDA_VISIBLE_DEVICES")}
		if err := appendLog(logDir, e); err != nil {
			fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		}
	}
	control := filepath.Join(pipeDir, "control")
	switch {
	case slices.Contains(args, "-f"):
		record("daemon", "start", "")
		if err := serve(control, func(cmd string) { record("daemon", "command", cmd) }); err != nil {
			fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
			return 1
		}
		record("daemon", "exit", "")
		return 0
	case slices.Contains(args, "-d"):
		return daemonize(control, stderr)
	default:
		record("client", "run", "")
		if err := send(control, stdin); err != nil {
			fmt.Fprintf(stderr, "Cannot find MPS control daemon process: %v\n", err)
			return 1
		}
		return 0
	}
}

// serve makes the control pipe and hands each line written to it to
// handle, until "quit" or SIGTERM.
func serve(control string, handle func(string)) error {
	if err := os.MkdirAll(filepath.Dir(control), 0o755); err != nil {
		return err
	}
	_ = os.Remove(control)
	if err := syscall.Mkfifo(control, 0o666); err != nil {
		return fmt.Errorf("make control pipe: %w", err)
	}
	// The umask must not narrow it: clients of any UID write to it.
	if err := os.Chmod(control, 0o666); err != nil {
		return err
	}
	made, err := os.Lstat(control)
	if err != nil {
		return err
	}
	defer func() {
		// Not a successor's pipe, made after this one was removed.
		if now, err := os.Lstat(control); err == nil && os.SameFile(made, now) {
			_ = os.Remove(control)
		}
	}()
	// Opened for reading and writing, so that a client closing its end is
	// no end of file: the daemon waits for the next one.
	pipe, err := os.OpenFile(control, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer pipe.Close()
	lines := make(chan string)
	go func() {
		s := bufio.NewScanner(pipe)
		for s.Scan() {
			lines <- s.Text()
		}
		close(lines)
	}()
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	for {
		select {
		case <-term:
			handle("SIGTERM")
			return nil
		case line, ok := <-lines:
			if !ok {
				return nil
			}
			handle(line)
			if line == "quit" {
				return nil
			}
		}
	}
}

// send copies stdin to the control pipe of a listening daemon.
func send(control string, stdin io.Reader) error {
	// Non-blocking: with no reader, that is no daemon, the open fails
	// at once rather than waiting for one.
	pipe, err := os.OpenFile(control, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer pipe.Close()
	s := bufio.NewScanner(stdin)
	for s.Scan() {
		if _, err := fmt.Fprintln(pipe, s.Text()); err != nil {
			return err
		}
	}
	return s.Err()
}

// daemonize starts the daemon in the background and waits until it
// listens.
func daemonize(control string, stderr io.Writer) int {
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		return 1
	}
	cmd := exec.Command(self, "-f")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		return 1
	}
	for range 500 {
		if _, err := os.Stat(control); err == nil {
			return 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintln(stderr, "fake-mps-control: the daemon did not listen")
	return 1
}

func appendLog(dir string, e mpstest.Entry) error {
	path := os.Getenv("FAKE_MPS_CONTROL_RECORD")
	if path == "" {
		path = filepath.Join(dir, logName)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	line, err := json.Marshal(e)
	if err != nil {
		return errors.Join(err, f.Close())
	}
	_, err = f.Write(append(line, '\n'))
	return errors.Join(err, f.Close())
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
