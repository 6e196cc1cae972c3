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
// is no GPU. It models the behaviour of MPS that NVIDIA documents (the
// nvidia-cuda-mps-control(1) man page and the MPS documentation), so that
// a design that could not work on a node fails against it too: one that
// depends on clients' environment variables for its limits, on clients of
// different UIDs sharing one server, or, with FAKE_MPS_SHM=shared, on a
// /dev/shm its clients do not share.
//
// It records what it does, one mpstest.Entry in JSON a line, in
// fake-mps-control.log in CUDA_MPS_LOG_DIRECTORY, or in the file that
// FAKE_MPS_CONTROL_RECORD names (it outlives the directories the plugin
// removes with the daemon):
//
//	{"role":"daemon","event":"start","args":["-f"],"pid":12,"pipeDir":"...","visibleDevices":"GPU-..."}
//	{"role":"client","event":"run","pid":13,"pipeDir":"..."}
//	{"role":"daemon","event":"command","command":"set_default_active_thread_percentage 40","pid":12,...}
//	{"role":"client","event":"connect","pid":14,"uid":1000,...}
//	{"role":"daemon","event":"server-start","pid":12,"uid":1000,"server":"15","activeThreadPercentage":40,...}
//	{"role":"client","event":"attach","pid":14,"uid":1000,"server":"15","activeThreadPercentage":40,...}
//	{"role":"client","event":"exit","pid":14,"uid":1000,...}
//	{"role":"daemon","event":"server-exit","pid":12,"uid":1000,"server":"15",...}
//	{"role":"daemon","event":"exit","pid":12,...}
//
// It reads CUDA_MPS_PIPE_DIRECTORY (default /tmp/nvidia-mps),
// CUDA_MPS_LOG_DIRECTORY (default /var/log/nvidia-mps) and
// CUDA_VISIBLE_DEVICES, as the real one does. Its state is the daemon
// process's, so daemons with pipe directories of their own are
// independent of each other, as in the documentation's "Starting multiple
// control/server pairs".
//
// # The control daemon: -f, -d
//
// With -f it runs the daemon in the foreground; with -d it starts itself
// with -f in a session of its own and returns once the daemon listens, as
// the real -d does. The daemon makes "control" in the pipe directory, a
// UNIX stream socket owned by the user it runs as (root, under the plugin)
// and mode 0666 whatever the umask: any process that can reach the pipe
// directory may command the daemon, quit included, as with the real one.
// It serves until "quit" or SIGTERM, stops its server, and removes
// "control" if it is still the one it made.
//
// The daemon listens on the socket it made, not on the path: once
// "control" is removed, or replaced, no client reaches it, as none reaches
// the real daemon, while it runs on. That is what the plugin's liveness
// check must notice.
//
// # The control client: no flags
//
// Without flags it is the control client: it sends each line of its
// standard input to the daemon as a command and prints the reply, nothing
// for a successful set. With no daemon listening it fails as the real one
// does: "Cannot find MPS control daemon process" and status 1. A command
// the daemon does not know, or one it refuses (a malformed argument, an
// unknown server), prints an error line to standard output, as the real
// interactive shell does, and the client goes on with the next line but
// exits 1 at the end, so that a script notices. The commands, named and
// spelt as in nvidia-cuda-mps-control(1):
//
//	quit
//	start_server -uid UID
//	get_server_list                                one server ID a line
//	get_client_list SERVER                         one client PID a line
//	set_default_active_thread_percentage P
//	get_default_active_thread_percentage           e.g. 40.0
//	set_active_thread_percentage SERVER P
//	get_active_thread_percentage SERVER
//	set_default_device_pinned_mem_limit DEV VALUE
//	get_default_device_pinned_mem_limit DEV        e.g. 8192M; 0 when none is set
//	set_device_pinned_mem_limit SERVER DEV VALUE
//	get_device_pinned_mem_limit SERVER DEV
//
// The limits are those of the documentation's "Active thread percentage"
// and "Device memory limit" (per server, so per UID, not per client). P is
// in (0, 100]. VALUE is a count of bytes with an optional binary
// suffix, K, M, G or T, with or without a B (8G, 8192M, 8192MB). The
// limits are the daemon's state: the defaults start at 100 and no
// pinned memory limit, and a server copies them when it starts. A later
// set_default_* does not change a running server ("If there is already a
// server spawned, this command will only affect the next server"); the
// set_* commands that name a server do, for the clients that join it
// after, not for those already attached (a running process's limits do
// not change).
//
// # Servers and users
//
// The daemon runs at most one server at a time, for one UID: the man
// page's description, and the documentation's on multi-user systems, of
// one MPS server per user ID within one control daemon. A server
// is a child process, named nvidia-cuda-mps-server and run as its UID
// (the daemon must be root to start one for another UID), whose PID is the
// server's ID. When a server starts it makes cuda.shm.<ID> in its /dev/shm
// with a random token, the shared memory its clients must map, and
// removes it when it exits. It exits with the daemon, even one killed
// with its process group (the server is in a group of its own, so that
// it may remove the file rather than leave it in the host's /dev/shm).
//
// A CUDA client of the server's UID joins it. A client of another UID
// queues: the daemon asks the server to exit once its clients are done,
// then starts one for the UID of the client that queued first (the man
// page: "the control daemon requests the existing server to shutdown as
// soon as all its clients are done"). The exact rule modelled:
//
//   - a server with no clients exits at once when a client of another UID
//     arrives, and that client does not count as having waited;
//   - a server with clients admits no new client, of its UID either, while
//     a client of another UID is queued ahead of it, so that UIDs take
//     turns in arrival order rather than the queued one starving;
//   - a server whose clients have all left keeps running, as the real one
//     does, unless a client of another UID is queued;
//   - start_server fails while a server runs.
//
// # The CUDA client: --cuda-client [--hold=D] [--alloc=BYTES] [--wait=D]
//
// With --cuda-client it stands in for a CUDA program initialising under
// MPS, a workload in a container. It connects to "control" in
// CUDA_MPS_PIPE_DIRECTORY; where that fails it runs without MPS, silently
// as CUDA does, and prints {"mps":false}. Otherwise the daemon, which
// learns the client's UID from the socket (SO_PEERCRED, as it cannot be
// forged), gives it a server of its UID or queues it as above, for up to
// --wait (default 10s). With FAKE_MPS_SHM=shared the client then reads the
// server's cuda.shm.<ID> from its own /dev/shm, and one that does not share
// the server's /dev/shm cannot reach the server, and fails: the rule
// NVIDIA documents for MPS clients in containers, which older drivers may
// hold to. By default it does not: on an H200 with CUDA 13.0's driver a
// client with an empty /dev/shm of its own connected and ran at its
// server's limits, and the server's /dev/shm held no file (measured in
// test/bench/results/2026-11-29-gpu-check-h200.md). Its effective limits are
// the server's, lowered, never raised, by its CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// and its CUDA_MPS_PINNED_DEVICE_MEM_LIMIT for device 0 ("0=8G,1=4G");
// a client that unsets them gets the server's, and an invalid value is
// ignored. --alloc fails above the effective pinned memory limit. It
// prints mpstest.ClientResult as one JSON line, stays attached for --hold
// (default 0; SIGTERM ends it early, as the program's exit would), and
// exits with one of mpstest's Exit* statuses when it fails, 1 on a flag it
// does not know.
//
// FAKE_MPS_SHM_DIR replaces /dev/shm for the daemon, its servers and its
// clients alike; it is for the stand-in's own tests, which must not
// depend on the host's /dev/shm. A server makes its file under either
// rule, so that only the client's environment picks the rule.
//
// # Not modelled
//
// Anything a GPU does: SM partitioning, memory accounting beyond --alloc's
// one comparison, error containment between the clients of a server (a
// fatal fault in one reported to all), and the server refusing clients
// after one. Nor: more than one device per client (limits are device 0's),
// static partitioning (-S), the daemon's own CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
// as a default, shutdown_server, terminate_client, get_server_status,
// get_device_client_list, the control_privileged pipe, the log files of
// the real daemon and server, and quit -t. The stand-in binds and dials
// "control" through the pipe directory's file descriptor, so paths longer
// than a socket address holds (108 bytes) work here; whether the real
// daemon copes with them is not known.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

const (
	logName = "fake-mps-control.log"
	// serverFlag runs the stand-in as a server, the daemon's child.
	serverFlag = "--fake-server"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	pipeDir := envOr("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
	logDir := envOr("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps")
	rec := &recorder{logDir: logDir, stderr: stderr, base: mpstest.Entry{Args: args, PID: os.Getpid(), PipeDir: pipeDir, VisibleDevices: os.Getenv("CUDA_VISIBLE_DEVICES")}}
	switch {
	case slices.Contains(args, serverFlag):
		return runServer(stdin, stdout, stderr)
	case slices.Contains(args, "-f"):
		return runDaemon(pipeDir, rec, stderr)
	case slices.Contains(args, "-d"):
		return daemonize(pipeDir, stderr)
	case len(args) > 0 && args[0] == "--cuda-client":
		return runCUDAClient(args[1:], pipeDir, rec, stdout, stderr)
	default:
		rec.record(mpstest.Entry{Role: "client", Event: "run"})
		return runControlClient(pipeDir, stdin, stdout, stderr)
	}
}

// recorder appends entries to the record, each completed with what every
// entry of this process carries.
type recorder struct {
	logDir string
	stderr io.Writer
	base   mpstest.Entry
}

func (r *recorder) record(e mpstest.Entry) {
	e.Args, e.PID, e.PipeDir, e.VisibleDevices = r.base.Args, r.base.PID, r.base.PipeDir, r.base.VisibleDevices
	if err := appendLog(r.logDir, e); err != nil {
		fmt.Fprintf(r.stderr, "fake-mps-control: %v\n", err)
	}
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

// shmDir is /dev/shm as this process sees it.
func shmDir() string {
	return envOr("FAKE_MPS_SHM_DIR", "/dev/shm")
}

// needsSharedMemory says whether a client must share its server's
// /dev/shm to reach it (FAKE_MPS_SHM=shared; see the package comment).
func needsSharedMemory() bool {
	return os.Getenv("FAKE_MPS_SHM") == "shared"
}

// shmName is the file in /dev/shm of the server with this ID.
func shmName(server int) string {
	return fmt.Sprintf("cuda.shm.%d", server)
}
