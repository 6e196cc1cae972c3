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

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// runDaemon is the control daemon in the foreground, until quit or
// SIGTERM.
func runDaemon(pipeDir string, rec *recorder, stderr io.Writer) int {
	rec.record(mpstest.Entry{Role: "daemon", Event: "start"})
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		return 1
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, syscall.SIGINT)
	l, made, err := listenControl(pipeDir)
	if err != nil {
		fmt.Fprintf(stderr, "fake-mps-control: %v\n", err)
		return 1
	}
	d := &daemon{self: self, rec: rec, defaults: defaultLimits()}
	quit := make(chan struct{}, 1)
	go func() {
		for {
			c, err := l.AcceptUnix()
			if err != nil {
				return
			}
			go d.serve(c, quit)
		}
	}()
	select {
	case <-term:
		rec.record(mpstest.Entry{Role: "daemon", Event: "command", Command: "SIGTERM"})
	case <-quit:
	}
	l.Close()
	d.shutdown()
	removeControl(pipeDir, made)
	rec.record(mpstest.Entry{Role: "daemon", Event: "exit"})
	return 0
}

// serve answers one connection: a control client's commands, or a CUDA
// client's attachCommand.
func (d *daemon) serve(c *net.UnixConn, quit chan<- struct{}) {
	defer c.Close()
	r := bufio.NewReader(c)
	enc := json.NewEncoder(c)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSpace(line)
		if name, arg, _ := strings.Cut(line, " "); name == attachCommand {
			d.attach(c, r, enc, arg)
			return
		}
		d.rec.record(mpstest.Entry{Role: "daemon", Event: "command", Command: line})
		rep, isQuit := d.execute(line)
		if err := enc.Encode(rep); err != nil {
			return
		}
		if isQuit {
			select {
			case quit <- struct{}{}:
			default:
			}
			return
		}
	}
}

// attach gives a CUDA client a server of its UID, after a wait if the
// running server is another UID's, and keeps it a client of that server
// until it disconnects.
func (d *daemon) attach(c *net.UnixConn, r io.Reader, enc *json.Encoder, arg string) {
	wait, err := time.ParseDuration(arg)
	if err != nil {
		_ = enc.Encode(attachReply{Error: fmt.Sprintf("invalid wait %q: %v", arg, err)})
		return
	}
	cred, err := peerCred(c)
	if err != nil {
		_ = enc.Encode(attachReply{Error: err.Error()})
		return
	}
	w := &waiter{uid: int(cred.Uid), pid: int(cred.Pid), conn: c, decided: make(chan struct{})}
	// The client sends nothing more: the end of its stream is its leaving.
	gone := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, r)
		close(gone)
	}()

	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		_ = enc.Encode(attachReply{Error: "the MPS control daemon quit"})
		return
	}
	d.queue = append(d.queue, w)
	d.settle()
	d.mu.Unlock()

	waited := false
	select {
	case <-w.decided:
	default:
		waited = true
		_ = enc.Encode(attachReply{Waiting: true})
		timer := time.NewTimer(wait)
		defer timer.Stop()
		select {
		case <-w.decided:
		case <-timer.C:
			if d.giveUp(w) {
				_ = enc.Encode(attachReply{Waited: true, TimedOut: true, Error: fmt.Sprintf("the MPS server of another UID still had clients after %v", wait)})
				return
			}
		case <-gone:
			if d.giveUp(w) {
				return
			}
		}
		// Decided while it gave up.
		<-w.decided
	}
	if w.err != nil {
		_ = enc.Encode(attachReply{Waited: waited, Error: w.err.Error()})
		return
	}
	rep := w.reply
	rep.Waited = waited
	if err := enc.Encode(rep); err == nil {
		<-gone
	}
	d.leave(w, w.server)
}

// giveUp takes a client that waits no more out of the queue; false if it
// was given a server meanwhile.
func (d *daemon) giveUp(w *waiter) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.dequeue(w)
}

// peerCred is the user and process of the client at the other end of c,
// as the kernel gives them: a client cannot claim another UID.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("the client's credentials: %w", credErr)
	}
	return cred, nil
}

// daemonize starts the daemon in the background and waits until it
// listens.
func daemonize(pipeDir string, stderr io.Writer) int {
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
	control := filepath.Join(pipeDir, controlName)
	for range 500 {
		if _, err := os.Stat(control); err == nil {
			return 0
		}
		time.Sleep(10 * time.Millisecond)
	}
	fmt.Fprintln(stderr, "fake-mps-control: the daemon did not listen")
	return 1
}
