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

// Package mps runs NVIDIA's Multi-Process Service for the shares of GPUs
// that claims hold, and tells each share's containers how to use it.
//
// # One control daemon per share
//
// What MPS enforces decides the design. NVIDIA documents (MPS
// documentation, "Tools and Interface Reference" and the
// nvidia-cuda-mps-control(1) man page):
//
//   - a control daemon runs one MPS server per user ID; a client whose UID
//     differs from the running server's waits until that server's clients
//     are done and it exits;
//   - limits are a server's: the daemon's defaults
//     (set_default_active_thread_percentage,
//     set_default_device_pinned_mem_limit) apply to the servers it starts
//     afterwards, and set_active_thread_percentage changes one server. A
//     client's CUDA_MPS_ACTIVE_THREAD_PERCENTAGE or
//     CUDA_MPS_PINNED_DEVICE_MEM_LIMIT can only lower its server's limits;
//   - any process that can write to a daemon's pipe directory can command
//     it, quit included, and a fatal fault of one client reaches every
//     client of its server;
//   - several control daemons can run side by side, each on a pipe
//     directory of its own ("Starting multiple control/server pairs").
//
// So one daemon cannot hold two tenants to different limits, cannot serve
// two UIDs at once, and cannot keep them from commanding or crashing each
// other. Prism therefore starts a daemon for each share, the first time
// the share is prepared, for its GPU alone (CUDA_VISIBLE_DEVICES set to
// its UUID), and stops it when the share is unprepared:
//
//   - before any client can connect, the daemon's defaults are set to the
//     share's limits and read back, so every server it starts has them and
//     a workload that drops the environment variables still has them. The
//     variables are set too, for the workload to read;
//   - the daemon's pipe directory, mounted at /tmp/nvidia-mps, and its
//     shared-memory directory, mounted at /dev/shm, reach only the share's
//     containers. What a tenant does to its daemon, it does to itself;
//   - shares of different tenants, whatever their UIDs, have servers of
//     their own and never wait for each other. The GPU runs the servers of
//     different shares time-sliced against each other, as it runs any two
//     processes, while each server holds its clients to the share's
//     memory; the containers of one share run concurrently in its server.
//     A server's SMs are capped only where the share's claim asks: under
//     time-slicing a cap keeps no share from slowing another, and on an
//     H200 it only slowed the share that held it. Containers of one share
//     with different UIDs take turns, as MPS documents;
//   - a fatal fault reaches the clients of one share's server only.
//
// The directories of a daemon, under the plugin's state directory:
//
//	<root>/<key>/pipe   CUDA_MPS_PIPE_DIRECTORY, mounted into the share's containers
//	<root>/<key>/shm    /dev/shm of the daemon, its servers and the share's containers
//	<root>/<key>/log    CUDA_MPS_LOG_DIRECTORY, the daemon's logs, mounted nowhere
//
// where the key is the claim's UID and the device's name. Shares prepared
// by a release that ran one daemon per GPU keep that daemon, keyed by the
// GPU's UUID, until their claims end.
//
// # Where a daemon runs
//
// A container runtime kills every process of a container that stops, so a
// daemon that a plugin in a pod started as its child would end with the
// plugin's container: on a crash, a restart, a helm upgrade. A plugin in a
// pod (the chart sets POD_NAME and POD_NAMESPACE) therefore runs each
// daemon in a pod of its own (Pods): in the plugin's namespace, bound to
// its node by name, from the plugin's image, with the driver root mounted
// read-only where the plugin has it. The pod is not the plugin's and
// outlives it; it ends when its share is unprepared. NVIDIA's own DRA
// driver also runs a daemon per claim, as a Deployment; Prism makes a bare
// pod, which costs one API object and no scheduling round, and whose
// start (about half a second) its first prepare waits for.
//
// A plugin that runs on the host starts each daemon as its child instead,
// in a session of its own and with -f (foreground) so that its PID is the
// daemon's. A plugin process that dies leaves it running.
//
// # /dev/shm
//
// MPS clients and their server exchange memory through /dev/shm. A daemon
// pod mounts the share's shared-memory directory there. A child is started
// through the plugin's own program under another name (RunLauncher), which
// makes a mount namespace for it, mounts the directory on /dev/shm there,
// and execs the control binary; a plugin on the host that cannot make
// mount namespaces cannot run MPS that works, and says so (Unavailable).
//
// # The directories tenants write
//
// The pipe and shared-memory directories are written by the share's
// clients, of any UID, so:
//
//   - they have mode 01777: the sticky bit keeps the daemon's pipes and
//     each client's files from being removed or renamed by another
//     non-root user;
//   - before the share is prepared again, Ensure checks that the daemon's
//     control pipe is still there, a pipe or socket owned by the daemon's
//     user. A daemon without one serves no new client (they would run
//     without MPS, silently) and cannot be told to quit: it is killed at
//     once and a fresh one started on the same directory, and Ensure
//     returns a ReplacedError, because the containers that used it have
//     lost their MPS server. A stop kills such a daemon at once too,
//     instead of waiting StopTimeout for a quit it cannot send;
//   - where the plugin may mount, and its mounts reach the host (the state
//     directory is a shared mount), each is a tmpfs of its own (PipeDirSize
//     and ShmDirSize bytes), so that tenants can write neither to the
//     host's disk nor beyond that. A directory that containers may already
//     have mounted is never mounted over, which they would not see: it
//     stays what it is until its share ends. Elsewhere they are plain, and
//     Unbounded says why.
//
// # Crash safety
//
// Each daemon is recorded in the plugin's checkpoint before it is started
// (without a PID), again once its pod is created, and once it listens
// with its limits set (with its PID, its start time in clock ticks after
// boot and its pod's container). At start-up, after
// the claims have been reconciled, Recover looks at every record:
//
//   - its share remains and the process is alive: it is adopted. A live
//     process is one whose /proc entry (the host's, for a daemon pod) has
//     the recorded start time (not a reused PID), runs
//     nvidia-cuda-mps-control, runs in the recorded container if it has a
//     pod, and has the recorded pipe directory in its environment (a
//     daemon pod's environment may be out of an unprivileged plugin's
//     reach; its container, of the pod the plugin made for that
//     directory, then stands for it); and it must still have its control
//     pipe, or it is killed and replaced as below;
//   - its share remains and the daemon died: a fresh one is started on the
//     same directories, with the share's limits. Containers that were
//     connected to the dead daemon's MPS server have lost it: their CUDA
//     calls fail and they must be restarted to connect to the new one;
//   - its share is gone: it is stopped and its directories removed.
//
// A share without a record gets a daemon too, and a daemon pod on the node
// that no record names (its plugin died between creating and recording
// it) is deleted.
//
// # Without nvidia-cuda-mps-control
//
// Where the driver root has no control binary, or the plugin cannot give a
// daemon its /dev/shm, shares are not enforced: they run time-sliced,
// which is the GPU's default, their memory limit is only advertised to
// the workload, and the plugin says so once at start-up and in an Event on
// each such claim. A prepare never fails for want of MPS.
package mps
