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

// Package mps runs NVIDIA's Multi-Process Service for the GPUs that claims
// share, and tells each share's containers how to use it.
//
// # One control daemon per shared GPU
//
// The first share prepared on a GPU starts nvidia-cuda-mps-control for that
// GPU alone (CUDA_VISIBLE_DEVICES set to its UUID), with a pipe and a log
// directory of its own under the plugin's state directory:
//
//	<root>/<GPU UUID>/pipe   CUDA_MPS_PIPE_DIRECTORY, mounted into each share's containers
//	<root>/<GPU UUID>/log    CUDA_MPS_LOG_DIRECTORY, the daemon's logs, mounted nowhere
//
// The last share unprepared stops it with the documented "quit" command sent
// through its pipe directory, then by signal if it does not go, and removes
// both directories. A GPU of its own per daemon keeps one tenant's daemon
// failure, and its restart, away from the tenants of the other GPUs.
//
// # The pipe directory
//
// The tenants of a GPU share its pipe directory, read-write, so that
// clients of any UID reach the daemon. So that none can break it for the
// others:
//
//   - it has mode 01777: the sticky bit keeps the daemon's pipes and each
//     tenant's files from being removed or renamed by another non-root
//     user;
//   - before each share is prepared, Ensure checks that the daemon's control
//     pipe is still there, a pipe or socket owned by the daemon's user. A
//     daemon without one serves no new client (they would run without
//     MPS, silently) and cannot be told to quit: it is killed at once and a
//     fresh one started on the same directory, and Ensure returns a
//     ReplacedError, because the containers that used it have lost their
//     MPS server. The last share's stop kills such a daemon at once too,
//     instead of waiting StopTimeout for a quit it cannot send;
//   - where the plugin may mount, and its mounts reach the host (the state
//     directory is a shared mount), a new pipe directory is a tmpfs of
//     PipeDirSize bytes, so that tenants can write neither to the host's
//     disk nor beyond that. A directory that containers may already have
//     mounted is never mounted over, which they would not see: it stays
//     what it is until its last share ends. Elsewhere pipe directories are
//     plain, and Unbounded says why.
//
// NVIDIA's own DRA driver runs each daemon as a Deployment of its own, which
// survives its kubelet plugin but costs an API object, an image and a
// scheduling round per shared GPU. Prism runs the daemon as a child of the
// plugin, started in a session of its own and with -f (foreground) so that
// its PID is the daemon's. A plugin process that dies leaves the daemon
// running; the next one adopts it. In a Kubernetes pod, however, the
// container runtime kills every process of a container that restarts, the
// daemon included: the next plugin then starts a fresh daemon, and see below
// for what that means to running clients.
//
// # Crash safety
//
// Each daemon is recorded in the plugin's checkpoint before it is started
// (without a PID) and again once it listens (with its PID and its start
// time in clock ticks after boot). At start-up, after the claims have been
// reconciled, Recover looks at every record:
//
//   - shares remain and the process is alive: it is adopted. A live process
//     is one whose /proc entry has the recorded start time (not a reused
//     PID), runs nvidia-cuda-mps-control, and has the recorded pipe
//     directory in its environment; and it must still have its control
//     pipe, or it is killed and replaced as below;
//   - shares remain and the daemon died: a fresh one is started on the same
//     pipe directory. Containers that were connected to the dead daemon's
//     MPS server have lost it: their CUDA calls fail and they must be
//     restarted to connect to the new one. New containers connect to it;
//   - no share remains: it is stopped and its directories removed.
//
// A GPU with shares and no record gets a daemon too.
//
// # Without nvidia-cuda-mps-control
//
// Where the driver root has no control binary, shares are not enforced: they
// run time-sliced, which is the GPU's default, their memory limit is only
// advertised to the workload, and the plugin says so once at start-up and in
// an Event on each such claim. A prepare never fails for want of MPS.
//
// # Limits
//
// MPS clients and their server also share memory through /dev/shm. The
// daemon runs in the plugin's container, so on real GPUs the plugin must
// share the IPC namespace that the clients' /dev/shm comes from; this
// package does not mount a shared /dev/shm into the clients.
package mps
