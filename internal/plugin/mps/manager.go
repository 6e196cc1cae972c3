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

package mps

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// ControlBinary is the MPS control program, looked up in the driver root.
const ControlBinary = "nvidia-cuda-mps-control"

// controlPipe is what a listening control daemon creates in its pipe
// directory.
const controlPipe = "control"

// Options configure a Manager.
type Options struct {
	// DriverRoot is where the NVIDIA driver is installed, as the plugin
	// sees it; the control binary is nvidia-cuda-mps-control in its
	// usr/bin or bin (see binaryDirs).
	DriverRoot string
	// Root holds a directory per daemon for its pipe, shared-memory and
	// log directories. It must be the same path on the host as in the
	// plugin, because containers mount the first two from the host.
	Root string
	// Checkpoint records the daemons.
	Checkpoint *checkpoint.Store
	// Registerer, when set, gets the daemons' metrics.
	Registerer prometheus.Registerer
	// ReadyTimeout is how long a new daemon may take to listen, StopTimeout
	// how long one may take to quit; ten seconds each by default.
	ReadyTimeout, StopTimeout time.Duration
	// ProcRoot is where processes are looked up; /proc by default. With
	// Pods, it must show the host's processes.
	ProcRoot string
	// Pods, when set, run each daemon in a pod of its own instead of as
	// the plugin's child: for a plugin that runs in a pod, whose
	// container's end would end its children (see Pods).
	Pods *Pods
}

// Daemon is one MPS control daemon that a caller needs.
type Daemon struct {
	// Key names the daemon and its directories: a share's own, or a GPU's
	// UUID for the daemon that a whole GPU's shares used before each share
	// had one of its own.
	Key string
	// UUID is the GPU it serves.
	UUID string
	// Limits are what the daemon gives each MPS server it starts, before
	// any client connects, so that a client cannot go beyond them: MPS
	// lets a client's environment lower a server's limits, never raise
	// them.
	Limits gpuv1alpha1.Share
}

// Manager runs MPS control daemons, each for one share of a GPU. Its
// methods may be called concurrently, but the caller must not start and
// stop a daemon at the same time: it decides from its prepared claims
// which daemons it needs.
type Manager struct {
	binary string
	// driverRoot is where the plugin has the driver root, and where a
	// daemon pod has it.
	driverRoot  string
	libDirs     []string
	pods        *Pods
	unavailable error
	// unbounded says why pipe directories are not tmpfs mounts; nil when
	// they are.
	unbounded   error
	root        string
	store       *checkpoint.Store
	procRoot    string
	ready, stop time.Duration
	metrics     *metrics

	mu sync.Mutex
	// exited holds, for each daemon this process started, a channel closed
	// once the daemon has ended and been reaped.
	exited map[int]chan struct{}
}

// binaryDirs are where driver packages (usr/bin) and driver roots laid out
// as on GKE (bin, under /home/kubernetes/bin/nvidia) install the driver's
// programs, relative to the driver root.
var binaryDirs = []string{"usr/bin", "bin"}

// findControl is the control binary in the driver root; "" if there is
// none.
func findControl(driverRoot string) string {
	if driverRoot == "" {
		return ""
	}
	for _, dir := range binaryDirs {
		binary := filepath.Join(driverRoot, dir, ControlBinary)
		if info, err := os.Stat(binary); err == nil && !info.IsDir() && info.Mode()&0o111 != 0 {
			return binary
		}
	}
	return ""
}

// libraryDirs are where driver packages and the GPU operator's driver
// container install libcuda, relative to the driver root; the MPS server
// loads it and the plugin's image has none.
var libraryDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "lib64", "usr/lib"}

// New makes a Manager. A driver root without the control binary is not an
// error: Unavailable then says why, and shares are left time-sliced.
func New(opts Options) *Manager {
	m := &Manager{
		root:     opts.Root,
		store:    opts.Checkpoint,
		procRoot: opts.ProcRoot,
		ready:    opts.ReadyTimeout,
		stop:     opts.StopTimeout,
		metrics:  newMetrics(opts.Registerer),
		exited:   map[int]chan struct{}{},
		pods:     opts.Pods,
	}
	if m.procRoot == "" {
		m.procRoot = "/proc"
	}
	if m.ready <= 0 {
		m.ready = 10 * time.Second
		if m.pods != nil {
			// The kubelet starts the pod's sandbox and container first.
			m.ready = 60 * time.Second
		}
	}
	if m.stop <= 0 {
		m.stop = 10 * time.Second
	}
	binary := findControl(opts.DriverRoot)
	if opts.DriverRoot == "" {
		m.unavailable = errors.New("no driver root was given to find " + ControlBinary + " in")
	} else if binary == "" {
		m.unavailable = fmt.Errorf("no executable %s in %s of the driver root %s", ControlBinary, strings.Join(binaryDirs, " or "), opts.DriverRoot)
	} else if err := m.checkLaunch(); err != nil {
		m.unavailable = err
	} else {
		m.binary, m.driverRoot = binary, opts.DriverRoot
		m.metrics.available.Set(1)
		m.unbounded = checkBound(m.root)
	}
	for _, dir := range libraryDirs {
		dir = filepath.Join(opts.DriverRoot, dir)
		if _, err := os.Stat(filepath.Join(dir, "libcuda.so.1")); err == nil {
			m.libDirs = append(m.libDirs, dir)
		}
	}
	m.updateGauge()
	return m
}

// checkLaunch says why the Manager cannot start daemons that work: a
// daemon pod gets its /dev/shm from the kubelet, a child from the plugin,
// which must be able to make mount namespaces.
func (m *Manager) checkLaunch() error {
	if m.pods == nil {
		return checkNamespaces(m.root)
	}
	if _, err := os.ReadDir(m.procRoot); err != nil {
		return fmt.Errorf("the plugin reads its daemon pods' processes in %s, and cannot: %w", m.procRoot, err)
	}
	return os.MkdirAll(m.root, 0o755)
}

// Unavailable says why shares cannot be enforced by MPS on this node; nil
// when they can.
func (m *Manager) Unavailable() error { return m.unavailable }

// Unbounded says why the pipe directories that the shares' containers
// write to are not size-limited tmpfs mounts but plain directories on the
// state directory's file system; nil when they are, or when MPS is
// unavailable and there are none.
func (m *Manager) Unbounded() error {
	if m.unavailable != nil {
		return nil
	}
	return m.unbounded
}

// PipeDir is the host path of a daemon's pipe directory. It depends on
// the daemon's key alone, so that a CDI spec written again from the
// checkpoint names the same directory.
func (m *Manager) PipeDir(key string) string { return filepath.Join(m.root, key, "pipe") }

// ShmDir is the host path of the directory that a daemon and its share's
// containers have as /dev/shm.
func (m *Manager) ShmDir(key string) string { return filepath.Join(m.root, key, "shm") }

func (m *Manager) logDir(key string) string { return filepath.Join(m.root, key, "log") }

// ReplacedError is what Ensure returns when it found a daemon dead, or
// alive but out of reach of its control pipe, and started a fresh one. The
// share is served; but containers that used the old daemon have lost their
// MPS server and must be restarted, which their owners should hear of.
type ReplacedError struct {
	// Key names the daemon, UUID its GPU.
	Key, UUID string
	// PID is the old daemon's.
	PID int
	// Reason is what was wrong with it.
	Reason string
}

func (e *ReplacedError) Error() string {
	return fmt.Sprintf("the MPS control daemon %d of %s on GPU %s was replaced: %s", e.PID, e.Key, e.UUID, e.Reason)
}

// Ensure makes sure the daemon runs: it starts it if none is recorded
// under its key, and a fresh one if the recorded one has died or can no
// longer be reached through its control pipe (which it kills first). A
// replaced daemon that had served shares is reported as a *ReplacedError.
func (m *Manager) Ensure(ctx context.Context, d Daemon) error {
	if m.unavailable != nil {
		return m.unavailable
	}
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.store.MPSDaemons()[d.Key]
	if !ok {
		return m.start(ctx, d, ResultStarted)
	}
	state, why := m.check(rec)
	switch state {
	case serving:
		return nil
	case unreachable:
		logger.Info("MPS control daemon cannot be reached; killing it and starting a fresh one. Containers that used it must be restarted to use the new one",
			"daemon", d.Key, "uuid", d.UUID, "pid", rec.PID, "reason", why)
		if err := m.kill(ctx, rec, StopUnreachable); err != nil {
			return err
		}
	case gone:
		logger.Info("MPS control daemon is gone; starting a fresh one. Containers that used it must be restarted to use the new one",
			"daemon", d.Key, "uuid", d.UUID, "pid", rec.PID, "reason", why)
	}
	if err := m.start(ctx, d, ResultRestarted); err != nil {
		return err
	}
	if rec.PID <= 0 {
		// Its start was cut short: no share used it.
		return nil
	}
	return &ReplacedError{Key: d.Key, UUID: d.UUID, PID: rec.PID, Reason: why}
}

// Stop stops the daemon, if one is recorded under key, and removes its
// directories and its record.
func (m *Manager) Stop(ctx context.Context, key string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	rec, ok := m.store.MPSDaemons()[key]
	if !ok {
		return nil
	}
	return m.stopDaemon(ctx, key, rec)
}

// Recover brings the recorded daemons in line with need, the daemons of
// the prepared shares that MPS enforces, by key: a live daemon that is
// needed is adopted, a dead one replaced, one no longer needed stopped,
// and a needed one without a record started. It runs at start-up, once the
// claims are reconciled. It returns the daemons it replaced, whose shares'
// containers lost their MPS server, which their owners should hear of.
func (m *Manager) Recover(ctx context.Context, need map[string]Daemon) ([]*ReplacedError, error) {
	logger := klog.FromContext(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	var replaced []*ReplacedError
	recorded := m.store.MPSDaemons()
	for _, key := range slices.Sorted(maps.Keys(recorded)) {
		rec := recorded[key]
		d, needed := need[key]
		if !needed {
			if err := m.stopDaemon(ctx, key, rec); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		state, why := m.check(rec)
		if state == serving {
			m.metrics.starts.WithLabelValues(ResultAdopted).Inc()
			logger.Info("Adopted MPS control daemon", "daemon", key, "uuid", rec.UUID, "pid", rec.PID, "pipeDir", rec.PipeDir)
			continue
		}
		if state == unreachable {
			logger.Info("MPS control daemon cannot be reached while its shares remain; killing it. Containers that used it have lost their MPS server and must be restarted",
				"daemon", key, "uuid", rec.UUID, "pid", rec.PID, "reason", why)
			if err := m.kill(ctx, rec, StopUnreachable); err != nil {
				errs = append(errs, err)
				continue
			}
		} else {
			logger.Info("MPS control daemon died while its shares remain. Containers that used it have lost their MPS server and must be restarted",
				"daemon", key, "uuid", rec.UUID, "pid", rec.PID, "reason", why)
		}
		if m.unavailable == nil {
			if err := m.start(ctx, d, ResultRestarted); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		if rec.PID > 0 {
			replaced = append(replaced, &ReplacedError{Key: key, UUID: rec.UUID, PID: rec.PID, Reason: why})
		}
	}
	if m.unavailable == nil {
		for _, key := range slices.Sorted(maps.Keys(need)) {
			if _, ok := recorded[key]; !ok {
				if err := m.start(ctx, need[key], ResultStarted); err != nil {
					errs = append(errs, err)
				}
			}
		}
	}
	if m.pods != nil {
		errs = append(errs, m.deleteUnrecordedPods(ctx))
	}
	m.updateGauge()
	return replaced, errors.Join(errs...)
}

// deleteUnrecordedPods deletes the daemon pods on the node that no record
// names: those of a plugin that died after it created a pod and before it
// recorded it, or after it forgot a daemon and before it deleted its pod.
func (m *Manager) deleteUnrecordedPods(ctx context.Context) error {
	pods, err := m.pods.list(ctx)
	if err != nil {
		return err
	}
	recorded := map[string]bool{}
	for _, rec := range m.store.MPSDaemons() {
		recorded[rec.Pod] = true
	}
	var errs []error
	for _, pod := range pods {
		if recorded[pod.Name] {
			continue
		}
		klog.FromContext(ctx).Info("Deleting an MPS daemon pod that no record names", "pod", klog.KObj(&pod), "daemon", pod.Annotations[DaemonAnnotation])
		errs = append(errs, m.pods.delete(ctx, pod.Name))
	}
	return errors.Join(errs...)
}

// daemonState is what became of a recorded daemon.
type daemonState int

const (
	// serving: it runs and listens on its control pipe.
	serving daemonState = iota
	// gone: it no longer runs (see running).
	gone
	// unreachable: it runs, but its control pipe is gone or is not its own
	// (see checkControl): clients cannot reach it, nor can quit.
	unreachable
)

// check says what became of the recorded daemon, and why it does not serve.
func (m *Manager) check(rec checkpoint.MPSDaemon) (daemonState, string) {
	if alive, why := m.running(rec); !alive {
		return gone, why
	}
	if err := checkControl(rec.PipeDir); err != nil {
		return unreachable, err.Error()
	}
	return serving, ""
}

// running says whether the recorded daemon still runs, and why not.
func (m *Manager) running(rec checkpoint.MPSDaemon) (bool, string) {
	if ch, ok := m.exited[rec.PID]; ok {
		select {
		case <-ch:
			return false, "it has exited"
		default:
		}
	}
	return running(m.procRoot, ControlBinary, rec)
}

// start starts a daemon and records it, before and after.
func (m *Manager) start(ctx context.Context, d Daemon, result string) (err error) {
	logger := klog.FromContext(ctx)
	defer func() {
		if err != nil {
			m.metrics.starts.WithLabelValues(ResultFailed).Inc()
			err = fmt.Errorf("start MPS control daemon %s for GPU %s: %w", d.Key, d.UUID, err)
		}
		m.updateGauge()
	}()
	rec := checkpoint.MPSDaemon{UUID: d.UUID, PipeDir: m.PipeDir(d.Key), LogDir: m.logDir(d.Key), ShmDir: m.ShmDir(d.Key), Limits: d.Limits}
	prev, recorded := m.store.MPSDaemons()[d.Key]
	if recorded && prev.PID == 0 {
		// A start cut short may have left a daemon whose PID was never
		// recorded; it listens on the same pipe directory.
		m.quit(ctx, prev)
	}
	if recorded && prev.Pod != "" && m.pods != nil {
		// The pod of a daemon that died, or was killed, or whose start was
		// cut short.
		if err := m.pods.delete(ctx, prev.Pod); err != nil {
			return err
		}
	}
	if err := preparePipeDir(rec.PipeDir, !recorded, m.unbounded); err != nil {
		return err
	}
	if err := prepareShmDir(rec.ShmDir, !recorded || prev.ShmDir == "", m.unbounded); err != nil {
		return err
	}
	// The servers, which run as their clients' users, may write their logs
	// here too; no container mounts it.
	if err := os.MkdirAll(rec.LogDir, 0o755); err != nil {
		return err
	}
	if err := unix.Chmod(rec.LogDir, pipeDirMode); err != nil {
		return fmt.Errorf("chmod %s: %w", rec.LogDir, err)
	}
	if err := m.record(ctx, d.Key, rec); err != nil {
		return err
	}
	launch := m.launchChild
	if m.pods != nil {
		launch = m.launchPod
	}
	pid, ticks, kill, err := launch(ctx, d.Key, &rec)
	if err != nil {
		return err
	}
	if err := m.limit(ctx, rec); err != nil {
		kill()
		return err
	}
	rec.PID, rec.StartTicks, rec.Started = pid, ticks, time.Now().UTC().Truncate(time.Second)
	if err := m.record(ctx, d.Key, rec); err != nil {
		// Unrecorded, it would be left behind by the next restart.
		kill()
		return err
	}
	m.metrics.starts.WithLabelValues(result).Inc()
	logger.Info("Started MPS control daemon", "daemon", d.Key, "uuid", d.UUID, "pid", pid, "pod", rec.Pod, "pipeDir", rec.PipeDir, "limits", rec.Limits.String(), "result", result)
	return nil
}

// launchChild starts the daemon of rec as a child of the plugin and waits
// until it listens. It returns its PID and start time, and how to kill it.
func (m *Manager) launchChild(ctx context.Context, _ string, rec *checkpoint.MPSDaemon) (int, uint64, func(), error) {
	out, err := os.OpenFile(filepath.Join(rec.LogDir, "daemon.out"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return 0, 0, nil, err
	}
	defer out.Close()
	// The launcher (see RunLauncher) gives the daemon its /dev/shm and
	// execs it, keeping the PID. -f keeps the daemon in the foreground, so
	// the PID is the daemon's; a session of its own keeps it out of the
	// plugin's process group. Not CommandContext: the daemon outlives the
	// call that starts it.
	cmd := &exec.Cmd{Path: "/proc/self/exe", Args: []string{launcherName, m.binary, "-f"}}
	cmd.Env = append(os.Environ(), m.daemonEnv(*rec, os.Getenv("PATH"), os.Getenv("LD_LIBRARY_PATH"))...)
	cmd.Env = append(cmd.Env, envLaunchShm+"="+rec.ShmDir)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return 0, 0, nil, err
	}
	pid := cmd.Process.Pid
	kill := func() { _ = syscall.Kill(-pid, syscall.SIGKILL) }
	exited := make(chan struct{})
	m.exited[pid] = exited
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	ended := func() (bool, string) {
		select {
		case <-exited:
			return true, "it exited"
		default:
			return false, ""
		}
	}
	if err := m.waitListening(ctx, rec.PipeDir, ended); err != nil {
		kill()
		return 0, 0, nil, fmt.Errorf("%w (see %s)", err, out.Name())
	}
	_, ticks, err := procStat(m.procRoot, pid)
	if err != nil {
		kill()
		return 0, 0, nil, err
	}
	return pid, ticks, kill, nil
}

// launchPod starts the daemon of rec in a pod of its own, records the pod,
// and waits until the daemon listens. It returns the daemon's PID and start
// time as the host's /proc gives them, and how to kill it.
func (m *Manager) launchPod(ctx context.Context, key string, rec *checkpoint.MPSDaemon) (int, uint64, func(), error) {
	env := m.daemonEnv(*rec, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "")
	pod := m.pods.daemonPod(key, *rec, m.driverRoot, []string{m.binary, "-f"}, env)
	name, err := m.pods.create(ctx, pod)
	if err != nil {
		return 0, 0, nil, err
	}
	kill := func() { _ = m.pods.delete(context.WithoutCancel(ctx), name) }
	rec.Pod = name
	if err := m.record(ctx, key, *rec); err != nil {
		kill()
		return 0, 0, nil, err
	}
	// The API server is asked at most every quarter second.
	var last time.Time
	var why string
	ended := func() (bool, string) {
		if time.Since(last) < 250*time.Millisecond {
			return false, why
		}
		last = time.Now()
		var done bool
		done, why = m.pods.ended(ctx, name)
		return done, why
	}
	if err := m.waitListening(ctx, rec.PipeDir, ended); err != nil {
		kill()
		return 0, 0, nil, fmt.Errorf("%w (kubectl logs -n %s %s)", err, m.pods.Namespace, name)
	}
	// The kubelet reports the container's ID a moment after it started.
	if rec.Container, err = m.pods.waitContainer(ctx, name, m.ready); err != nil {
		kill()
		return 0, 0, nil, err
	}
	pid, ticks, err := findDaemon(m.procRoot, m.binary, *rec)
	if err != nil {
		kill()
		return 0, 0, nil, err
	}
	return pid, ticks, kill, nil
}

// waitListening waits until the daemon listens on its control pipe in
// pipeDir, or ended says it has ended, and why.
func (m *Manager) waitListening(ctx context.Context, pipeDir string, ended func() (bool, string)) error {
	var why string
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, m.ready, true, func(context.Context) (bool, error) {
		// The daemon's own pipe: not one a tenant made in its place.
		if checkControl(pipeDir) == nil {
			return true, nil
		}
		var done bool
		if done, why = ended(); done {
			return false, errors.New("the daemon ended before it listened: " + why)
		}
		return false, nil
	})
	if wait.Interrupted(err) {
		if why != "" {
			why = "; " + why
		}
		return fmt.Errorf("no %s in %s after %s%s", controlPipe, pipeDir, m.ready, why)
	}
	return err
}

// stopDaemon asks the daemon to quit, kills it if it does not, and removes
// its directories and record. Only a daemon that listens on its control
// pipe is asked and waited for, StopTimeout at most for both; one that
// cannot be reached is killed at once, so that a tenant who removed the
// pipe cannot make the caller, which holds the driver lock, wait.
func (m *Manager) stopDaemon(ctx context.Context, key string, rec checkpoint.MPSDaemon) error {
	logger := klog.FromContext(ctx)
	switch state, why := m.check(rec); {
	case state == serving:
		if m.quitAndWait(ctx, rec) {
			m.metrics.stops.WithLabelValues(StopQuit).Inc()
			break
		}
		logger.Info("MPS control daemon did not quit; killing it", "uuid", rec.UUID, "pid", rec.PID, "timeout", m.stop)
		if err := m.kill(ctx, rec, StopKilled); err != nil {
			return err
		}
	case state == unreachable:
		logger.Info("MPS control daemon cannot be reached to quit; killing it", "uuid", rec.UUID, "pid", rec.PID, "reason", why)
		if err := m.kill(ctx, rec, StopUnreachable); err != nil {
			return err
		}
	case rec.PID == 0:
		m.quit(ctx, rec)
	}
	if m.pods != nil && rec.Pod != "" {
		if err := m.pods.delete(ctx, rec.Pod); err != nil {
			return err
		}
	}
	if err := removeDaemonDirs(filepath.Dir(rec.PipeDir), rec.PipeDir, rec.ShmDir); err != nil {
		return fmt.Errorf("remove the directories of MPS control daemon %s: %w", key, err)
	}
	if err := m.store.Update(ctx, func(d *checkpoint.Data) error {
		delete(d.MPSDaemons, key)
		return nil
	}); err != nil {
		return fmt.Errorf("forget MPS control daemon %s: %w", key, err)
	}
	delete(m.exited, rec.PID)
	m.updateGauge()
	logger.Info("Stopped MPS control daemon", "daemon", key, "uuid", rec.UUID, "pid", rec.PID)
	return nil
}

// quitAndWait sends the daemon quit and waits until it is gone, both
// within StopTimeout; false if it is still there then.
func (m *Manager) quitAndWait(ctx context.Context, rec checkpoint.MPSDaemon) bool {
	ctx, cancel := context.WithTimeout(ctx, m.stop)
	defer cancel()
	m.quit(ctx, rec)
	return m.waitGone(ctx, rec)
}

// kill ends a daemon, its process group (the MPS servers it started) with
// it, without asking, and counts the stop as result.
func (m *Manager) kill(ctx context.Context, rec checkpoint.MPSDaemon, result string) error {
	if m.pods != nil && rec.Pod != "" {
		// Not the plugin's to signal: the kubelet kills its pod's container.
		if err := m.pods.delete(ctx, rec.Pod); err != nil {
			return err
		}
	} else {
		_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
	if !m.waitGone(ctx, rec) {
		return fmt.Errorf("MPS control daemon %d of GPU %s survived SIGKILL", rec.PID, rec.UUID)
	}
	m.metrics.stops.WithLabelValues(result).Inc()
	delete(m.exited, rec.PID)
	return nil
}

// quit sends the daemon the documented quit command through its pipe
// directory, if the control pipe there is the daemon's. Failing is not an
// error: the caller checks the process.
func (m *Manager) quit(ctx context.Context, rec checkpoint.MPSDaemon) {
	if m.binary == "" {
		return
	}
	if checkControl(rec.PipeDir) != nil {
		return
	}
	if _, err := m.control(ctx, rec, "quit"); err != nil {
		klog.FromContext(ctx).Info("Sending quit to the MPS control daemon failed", "uuid", rec.UUID, "pid", rec.PID, "err", err.Error())
	}
}

// control sends the daemon one command through the control client, within
// StopTimeout, and returns what the client printed.
func (m *Manager) control(ctx context.Context, rec checkpoint.MPSDaemon, command string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, m.stop)
	defer cancel()
	cmd := exec.CommandContext(ctx, m.binary)
	cmd.Env = m.env(rec)
	cmd.Stdin = strings.NewReader(command + "\n")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", command, err, strings.TrimSpace(stdout.String()+" "+stderr.String()))
	}
	return strings.TrimSpace(stdout.String()), nil
}

// waitGone waits, within StopTimeout, until the daemon has ended. A child
// of this process has ended once it is reaped: an exiting process drops
// its environment before it becomes a zombie, so /proc alone would call
// it another process while it still runs.
func (m *Manager) waitGone(ctx context.Context, rec checkpoint.MPSDaemon) bool {
	if ch, ok := m.exited[rec.PID]; ok {
		timer := time.NewTimer(m.stop)
		defer timer.Stop()
		select {
		case <-ch:
			return true
		case <-timer.C:
		case <-ctx.Done():
		}
		return false
	}
	err := wait.PollUntilContextTimeout(ctx, 20*time.Millisecond, m.stop, true, func(context.Context) (bool, error) {
		alive, _ := m.running(rec)
		return !alive, nil
	})
	return err == nil
}

func (m *Manager) record(ctx context.Context, key string, rec checkpoint.MPSDaemon) error {
	return m.store.Update(ctx, func(d *checkpoint.Data) error {
		if d.MPSDaemons == nil {
			d.MPSDaemons = map[string]checkpoint.MPSDaemon{}
		}
		d.MPSDaemons[key] = rec
		return nil
	})
}

// env is the control client's environment.
func (m *Manager) env(rec checkpoint.MPSDaemon) []string {
	return append(os.Environ(), m.daemonEnv(rec, os.Getenv("PATH"), os.Getenv("LD_LIBRARY_PATH"))...)
}

// daemonEnv is what a daemon, or its control client, needs in its
// environment besides what it inherits: its directories and GPU, the
// driver root's programs in front of path and libraries in front of
// libraryPath.
func (m *Manager) daemonEnv(rec checkpoint.MPSDaemon, path, libraryPath string) []string {
	env := []string{
		EnvPipeDirectory + "=" + rec.PipeDir,
		EnvLogDirectory + "=" + rec.LogDir,
		"CUDA_VISIBLE_DEVICES=" + rec.UUID,
		// The control daemon starts nvidia-cuda-mps-server from its PATH.
		"PATH=" + filepath.Dir(m.binary) + ":" + path,
	}
	if len(m.libDirs) > 0 {
		dirs := strings.Join(m.libDirs, ":")
		if libraryPath != "" {
			dirs += ":" + libraryPath
		}
		env = append(env, "LD_LIBRARY_PATH="+dirs)
	}
	return env
}

func (m *Manager) updateGauge() {
	n := 0
	if m.store != nil {
		for _, rec := range m.store.MPSDaemons() {
			if rec.PID > 0 {
				n++
			}
		}
	}
	m.metrics.daemons.Set(float64(n))
}
