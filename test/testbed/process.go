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

package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// Process is one component of the test bed running as a child process with its
// output in a log file, so that a failing test can show what the component said.
type Process struct {
	Name    string
	LogPath string
	cmd     *exec.Cmd
	done    chan struct{}
	exitErr error
}

// StartProcess runs bin with args in dir, appending stdout and stderr to logPath.
// The child gets its own process group so that Stop reaches anything it spawned.
func StartProcess(ctx context.Context, name, dir, logPath, bin string, args ...string) (*Process, error) {
	return StartProcessWithEnv(ctx, name, dir, logPath, nil, bin, args...)
}

// StartProcessWithEnv is StartProcess with extra environment variables
// (KEY=VALUE) for the child, on top of this process's environment.
func StartProcessWithEnv(ctx context.Context, name, dir, logPath string, env []string, bin string, args ...string) (*Process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("start %s: open log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Process{Name: name, LogPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	klog.FromContext(ctx).V(2).Info("Started process", "name", name, "pid", cmd.Process.Pid, "log", logPath)
	return p, nil
}

// Pid is the child's process ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.exitErr
	default:
		return false, nil
	}
}

// Done is closed when the process has ended.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop asks the process group to terminate and kills it if it is still there
// after the grace period. Stopping an ended process is a no-op.
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	return nil
}

// Kill ends the process group at once with SIGKILL, as a crash would.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
}

// Wait blocks until the process ends or ctx is done.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		var exitErr *exec.ExitError
		if errors.As(p.exitErr, &exitErr) {
			return fmt.Errorf("%s exited: %w", p.Name, p.exitErr)
		}
		return p.exitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}
