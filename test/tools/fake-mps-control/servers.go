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
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// stopTimeout bounds how long a server takes to exit before it is killed.
const stopTimeout = 5 * time.Second

// daemon is the control daemon's state. Whether the server must exit is
// not stored: it must once it has no clients and a client of another UID
// is queued.
type daemon struct {
	// self is this binary, run as each server.
	self string
	rec  *recorder

	mu       sync.Mutex
	defaults limits
	// server is the running server; at most one runs.
	server *server
	// queue holds the CUDA clients that wait for a server of their UID,
	// in arrival order.
	queue  []*waiter
	closed bool
}

type server struct {
	id, uid int
	// limits are copied from the defaults when the server starts.
	limits  limits
	token   string
	clients map[*waiter]bool
	proc    *os.Process
	// stdin is the server's standard input; closing it stops the server.
	stdin  io.Closer
	exited chan struct{}
}

// waiter is a CUDA client, queued until decided is closed, then a client
// of server if err is nil.
type waiter struct {
	uid, pid int
	conn     net.Conn
	decided  chan struct{}
	server   *server
	reply    attachReply
	err      error
}

// decide ends w's wait: it joins s, or fails with err. d.mu is held.
func (w *waiter) decide(s *server, err error) {
	w.server, w.err = s, err
	if s != nil {
		w.reply = attachReply{Server: s.id, UID: s.uid, Limits: s.limits.clone(), Shm: shmName(s.id), Token: s.token}
	}
	close(w.decided)
}

// settle starts, admits to and stops servers until the queue is empty or
// waits for the running server's clients to leave. d.mu is held.
func (d *daemon) settle() {
	for len(d.queue) > 0 {
		if d.server == nil {
			w := d.queue[0]
			s, err := d.startServer(w.uid)
			if err != nil {
				d.queue = d.queue[1:]
				w.decide(nil, err)
				continue
			}
			d.server = s
		}
		s := d.server
		// Only the clients of the server's UID ahead of any other UID's:
		// the others take their turn first.
		for len(d.queue) > 0 && d.queue[0].uid == s.uid {
			w := d.queue[0]
			d.queue = d.queue[1:]
			s.clients[w] = true
			w.decide(s, nil)
		}
		if len(d.queue) == 0 || len(s.clients) > 0 {
			return
		}
		d.stopServer()
	}
}

// dequeue takes w out of the queue, if it is still there. d.mu is held.
func (d *daemon) dequeue(w *waiter) bool {
	i := slices.Index(d.queue, w)
	if i < 0 {
		return false
	}
	d.queue = slices.Delete(d.queue, i, i+1)
	d.settle()
	return true
}

// leave ends w's time as a client of s.
func (d *daemon) leave(w *waiter, s *server) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server == s {
		delete(s.clients, w)
		d.settle()
	}
}

// startServer starts a server for uid, with the default limits. d.mu is
// held.
func (d *daemon) startServer(uid int) (*server, error) {
	cmd := exec.Command(d.self, serverFlag)
	cmd.Args[0] = "nvidia-cuda-mps-server"
	cmd.Stderr = os.Stderr
	// A server outlives no daemon, even a killed one. It is in a process
	// group of its own so that killing the daemon's group, as the plugin
	// does, leaves it to remove its file in /dev/shm when it notices.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if self := os.Geteuid(); uid != self {
		if self != 0 {
			return nil, fmt.Errorf("cannot start an MPS server for UID %d: the control daemon runs as UID %d, not root", uid, self)
		}
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(uid), Gid: primaryGID(uid)}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start MPS server for UID %d: %w", uid, err)
	}
	token, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		_ = cmd.Process.Kill()
		return nil, errors.Join(fmt.Errorf("MPS server for UID %d did not start: %w", uid, err), cmd.Wait())
	}
	s := &server{
		id: cmd.Process.Pid, uid: uid, limits: d.defaults.clone(), token: strings.TrimSpace(token),
		clients: map[*waiter]bool{}, proc: cmd.Process, stdin: stdin, exited: make(chan struct{}),
	}
	go func() {
		_ = cmd.Wait()
		close(s.exited)
		d.serverExited(s)
	}()
	d.recordServer("server-start", s, "")
	return s, nil
}

// primaryGID is uid's group, as the server runs with it; uid's number
// where the user is not known.
func primaryGID(uid int) uint32 {
	if u, err := user.LookupId(strconv.Itoa(uid)); err == nil {
		if gid, err := strconv.ParseUint(u.Gid, 10, 32); err == nil {
			return uint32(gid)
		}
	}
	return uint32(uid)
}

// stopServer stops the running server and disconnects its clients. d.mu
// is held.
func (d *daemon) stopServer() {
	s := d.server
	d.server = nil
	_ = s.stdin.Close()
	select {
	case <-s.exited:
	case <-time.After(stopTimeout):
		_ = s.proc.Kill()
		<-s.exited
		// It could not remove its shared memory.
		_ = os.Remove(filepath.Join(shmDir(), shmName(s.id)))
	}
	for w := range s.clients {
		_ = w.conn.Close()
	}
	d.recordServer("server-exit", s, "")
}

// serverExited notes a server that exited without being stopped: killed,
// or failed.
func (d *daemon) serverExited(s *server) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.server != s {
		return
	}
	d.server = nil
	for w := range s.clients {
		_ = w.conn.Close()
	}
	d.recordServer("server-exit", s, "the server exited on its own")
	d.settle()
}

// shutdown fails the queued clients and stops the server, as quit does.
func (d *daemon) shutdown() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for _, w := range d.queue {
		w.decide(nil, errors.New("the MPS control daemon quit"))
	}
	d.queue = nil
	if d.server != nil {
		d.stopServer()
	}
}

// recordServer records a server's event, with the error that ended it if
// it exited on its own.
func (d *daemon) recordServer(event string, s *server, err string) {
	uid := s.uid
	d.rec.record(mpstest.Entry{
		Role: "daemon", Event: event, UID: &uid, Server: strconv.Itoa(s.id),
		ActiveThreadPercentage: s.limits.ActiveThreadPercentage, PinnedMemLimitBytes: s.limits.PinnedMem[0], Error: err,
	})
}
