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
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// A plugin in a pod runs its daemons in pods of their own. These tests
// play the kubelet of its node (podKubelet): it runs each daemon pod's
// command as a process, reports its container, and kills it when the pod
// is deleted. The plugin sees the processes in a /proc of the test's
// making, whose entries are the real ones but for the cgroup, which names
// the pod's container as the kubelet's cgroups do. The e2e test on
// containerd runs the same through a real kubelet.

const podNode = "gpu-node"

// podKubelet runs the daemon pods that the plugin creates.
type podKubelet struct {
	t        *testing.T
	client   *fake.Clientset
	procRoot string

	mu    sync.Mutex
	procs map[string]*exec.Cmd // by pod name
	next  int
}

func newPodKubelet(t *testing.T) *podKubelet {
	t.Helper()
	k := &podKubelet{t: t, client: fake.NewClientset(), procRoot: t.TempDir(), procs: map[string]*exec.Cmd{}}
	// The fake API server names no pod from its generateName.
	k.client.PrependReactor("create", "pods", func(action k8stesting.Action) (bool, runtime.Object, error) {
		pod := action.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" {
			k.mu.Lock()
			k.next++
			pod.Name = fmt.Sprintf("%s%d", pod.GenerateName, k.next)
			k.mu.Unlock()
		}
		return false, nil, nil
	})
	w, err := k.client.CoreV1().Pods("").Watch(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			switch ev.Type {
			case watch.Added:
				k.run(pod)
			case watch.Deleted:
				k.kill(pod.Name)
			}
		}
	}()
	t.Cleanup(func() {
		w.Stop()
		<-done
		k.mu.Lock()
		defer k.mu.Unlock()
		for name := range k.procs {
			k.killLocked(name)
		}
	})
	return k
}

// run starts the pod's command with its environment and /dev/shm, as its
// container would, and reports it running.
func (k *podKubelet) run(pod *corev1.Pod) {
	c := pod.Spec.Containers[0]
	cmd := exec.Command(c.Command[0], c.Command[1:]...)
	for _, e := range c.Env {
		cmd.Env = append(cmd.Env, e.Name+"="+e.Value)
	}
	for _, v := range pod.Spec.Volumes {
		if v.Name == "shm" {
			cmd.Env = append(cmd.Env, "FAKE_MPS_SHM_DIR="+v.HostPath.Path)
		}
	}
	cmd.Env = append(cmd.Env, "FAKE_MPS_CONTROL_RECORD="+os.Getenv("FAKE_MPS_CONTROL_RECORD"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		k.t.Errorf("start the daemon of pod %s: %v", pod.Name, err)
		return
	}
	go func() { _ = cmd.Wait() }()
	id := fmt.Sprintf("%064d", cmd.Process.Pid)
	k.expose(cmd.Process.Pid, "0::/kubepods/besteffort/pod"+string(pod.UID)+"/"+id+"\n")
	k.mu.Lock()
	k.procs[pod.Name] = cmd
	k.mu.Unlock()
	pod = pod.DeepCopy()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: c.Name, ContainerID: "containerd://" + id, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
	// A pod deleted before it ran is no error.
	if _, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
		k.t.Errorf("report pod %s running: %v", pod.Name, err)
	}
}

// expose makes pid's entry in the test's /proc: its real stat, cmdline
// and environ, and cgroup.
func (k *podKubelet) expose(pid int, cgroup string) {
	dir := filepath.Join(k.procRoot, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		k.t.Error(err)
	}
	for _, f := range []string{"stat", "cmdline", "environ"} {
		if err := os.Symlink(filepath.Join("/proc", strconv.Itoa(pid), f), filepath.Join(dir, f)); err != nil {
			k.t.Error(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		k.t.Error(err)
	}
}

func (k *podKubelet) kill(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.killLocked(name)
}

func (k *podKubelet) killLocked(name string) {
	if cmd, ok := k.procs[name]; ok {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		delete(k.procs, name)
	}
}

// pods are the daemon pods, by name.
func (k *podKubelet) pods(t *testing.T) map[string]*corev1.Pod {
	t.Helper()
	list, err := k.client.CoreV1().Pods("prism").List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*corev1.Pod{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out
}

// startInPods makes a manager that runs its daemons in pods, as a
// restarted plugin in a pod does.
func (e *env) startInPods(t *testing.T, k *podKubelet) *Manager {
	t.Helper()
	return New(e.reopen(t, Options{
		Registerer: prometheus.NewRegistry(), ProcRoot: k.procRoot, ReadyTimeout: 10 * time.Second,
		Pods: &Pods{Client: k.client, Namespace: "prism", Node: podNode, Image: "prism-kubelet-plugin:test", HostDriverRoot: "/host" + e.driverRoot,
			Labels: map[string]string{"app.kubernetes.io/instance": "prism"}},
	}))
}

// TestDaemonsInPods: a daemon runs in a pod of its own, with its limits
// set through its control pipe; a plugin that comes next adopts it by its
// process in the pod's container, replaces it when its pod is gone, stops
// it and deletes its pod when its share ends, and deletes the pods that no
// record names.
func TestDaemonsInPods(t *testing.T) {
	e := newEnv(t)
	k := newPodKubelet(t)
	m := e.startInPods(t, k)
	if err := m.Unavailable(); err != nil {
		t.Fatal(err)
	}
	share := Daemon{Key: "claim-a-gpu-0", UUID: gpuA, Limits: gpuv1alpha1.Share{ComputePercent: 30, MemoryBytes: 10 << 30}}
	if err := m.Ensure(t.Context(), share); err != nil {
		t.Fatal(err)
	}
	rec := e.store.MPSDaemons()[share.Key]
	pods := k.pods(t)
	pod := pods[rec.Pod]
	if len(pods) != 1 || pod == nil || rec.Container == "" || rec.PID == 0 {
		t.Fatalf("after the first share: pods %v, record %+v; want one pod, recorded with its container and the daemon's PID", pods, rec)
	}
	if got := pod.Annotations[DaemonAnnotation]; got != share.Key || pod.Spec.NodeName != podNode || pod.Labels[ComponentLabel] != DaemonComponent {
		t.Errorf("daemon pod %s: annotation %q, node %q, labels %v", pod.Name, got, pod.Spec.NodeName, pod.Labels)
	}
	limited := []string{"set_default_active_thread_percentage 30", "set_default_device_pinned_mem_limit 0 10240M"}
	for _, want := range limited {
		if !recorded(t, e.record, want) {
			t.Errorf("the daemon was not sent %q", want)
		}
	}

	// A plugin that comes next adopts the daemon, as long as its process
	// runs in the pod's container.
	m = e.startInPods(t, k)
	if replaced, err := m.Recover(t.Context(), map[string]Daemon{share.Key: share}); err != nil || len(replaced) != 0 {
		t.Fatalf("recover: replaced %v, %v; want the daemon adopted", replaced, err)
	}
	if got := e.store.MPSDaemons()[share.Key]; got.PID != rec.PID || got.Pod != rec.Pod {
		t.Fatalf("after a restart the record is %+v, want the adopted %+v", got, rec)
	}

	// A deleted pod ends its daemon: the next prepare replaces it.
	if err := k.client.CoreV1().Pods("prism").Delete(t.Context(), rec.Pod, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitDead(t, rec.PID)
	var replaced *ReplacedError
	if err := m.Ensure(t.Context(), share); !errors.As(err, &replaced) || replaced.PID != rec.PID {
		t.Fatalf("ensure after the pod was deleted: %v, want the daemon %d replaced", err, rec.PID)
	}
	next := e.store.MPSDaemons()[share.Key]
	if next.Pod == rec.Pod || next.PID == rec.PID || len(k.pods(t)) != 1 {
		t.Fatalf("after the replacement: record %+v, pods %v; want a new pod and daemon, alone", next, k.pods(t))
	}

	// A pod that no record names (its plugin died before it recorded it)
	// is deleted at the next start; the share's own is kept.
	orphan := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "prism-mps-orphan", Namespace: "prism", Labels: map[string]string{"app.kubernetes.io/instance": "prism", ComponentLabel: DaemonComponent}}, Spec: corev1.PodSpec{NodeName: podNode,
		Containers: []corev1.Container{{Name: daemonContainer, Command: []string{"sleep", "3600"}}}}}
	if _, err := k.client.CoreV1().Pods("prism").Create(t.Context(), orphan, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	m = e.startInPods(t, k)
	if _, err := m.Recover(t.Context(), map[string]Daemon{share.Key: share}); err != nil {
		t.Fatal(err)
	}
	if pods := k.pods(t); len(pods) != 1 || pods[next.Pod] == nil {
		t.Errorf("after a start with an unrecorded pod: pods %v, want only %s", pods, next.Pod)
	}

	// The share ends: the daemon quits, its pod, directories and record go.
	if err := m.Stop(t.Context(), share.Key); err != nil {
		t.Fatal(err)
	}
	if pods := k.pods(t); len(pods) != 0 {
		t.Errorf("after the share ended: pods %v, want none", pods)
	}
	if _, err := os.Stat(filepath.Dir(next.PipeDir)); !os.IsNotExist(err) {
		t.Errorf("the daemon's directory: %v, want it removed", err)
	}
	if !recorded(t, e.record, "quit") {
		t.Error("the daemon was not asked to quit")
	}
}

// TestDaemonPodAdoptionIsStrict: a process is the recorded daemon only if
// it runs the control binary with -f, started at the recorded time, in the
// recorded container.
func TestDaemonPodAdoptionIsStrict(t *testing.T) {
	proc := t.TempDir()
	self := os.Getpid()
	_, ticks, err := procStat("/proc", self)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(pid int, argv, cgroup string) {
		dir := filepath.Join(proc, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := fmt.Sprintf("%d (nvidia-cuda-mps) S 1 1 1 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0", pid, ticks)
		environ := EnvPipeDirectory + "=/state/mps/" + cgroup[len(cgroup)-5:len(cgroup)-1] + "/pipe\x00"
		for name, data := range map[string]string{"stat": stat, "cmdline": argv, "cgroup": cgroup, "environ": environ} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	const binary = "/driver/usr/bin/nvidia-cuda-mps-control"
	entry(100, binary+"\x00-f\x00", "0::/kubepods/pod1/aaaa\n") // the daemon
	entry(101, binary+"\x00", "0::/kubepods/pod1/aaaa\n")       // a control client in its container
	entry(102, binary+"\x00-f\x00", "0::/kubepods/pod2/bbbb\n") // another share's daemon
	entry(103, "/bin/sh\x00-f\x00", "0::/kubepods/pod1/aaaa\n") // another program
	pid, got, err := findDaemon(proc, binary, checkpoint.MPSDaemon{Pod: "p", Container: "aaaa", PipeDir: "/state/mps/aaaa/pipe"})
	if err != nil || pid != 100 || got != ticks {
		t.Fatalf("findDaemon: %d, %d, %v; want 100, %d", pid, got, err, ticks)
	}
	for _, tc := range []struct {
		name string
		rec  checkpoint.MPSDaemon
		want string
	}{
		{"the daemon", checkpoint.MPSDaemon{PID: 100, StartTicks: ticks, Container: "aaaa", PipeDir: "/state/mps/aaaa/pipe"}, ""},
		{"another container", checkpoint.MPSDaemon{PID: 100, StartTicks: ticks, Container: "cccc", PipeDir: "/state/mps/aaaa/pipe"}, "its PID runs outside the daemon's container cccc"},
		{"another pipe directory", checkpoint.MPSDaemon{PID: 100, StartTicks: ticks, Container: "aaaa", PipeDir: "/state/mps/cccc/pipe"}, "its PID serves another pipe directory"},
		{"a reused PID", checkpoint.MPSDaemon{PID: 100, StartTicks: ticks + 1, Container: "aaaa", PipeDir: "/state/mps/aaaa/pipe"}, "its PID belongs to a process started at another time"},
		{"another program", checkpoint.MPSDaemon{PID: 103, StartTicks: ticks, Container: "aaaa", PipeDir: "/state/mps/aaaa/pipe"}, `its PID runs "/bin/sh"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, why := running(proc, binary, tc.rec)
			if diff := cmp.Diff(tc.want, why); diff != "" {
				t.Errorf("running (-want +got):\n%s", diff)
			}
		})
	}

	// A plugin that may not read its daemons' environment (an
	// unprivileged one) has the container alone to go by; one of a child
	// daemon's is an error.
	readEnviron = func(string) ([]byte, error) { return nil, os.ErrPermission }
	t.Cleanup(func() { readEnviron = os.ReadFile })
	if ok, why := running(proc, binary, checkpoint.MPSDaemon{PID: 100, StartTicks: ticks, Container: "aaaa", PipeDir: "/state/mps/cccc/pipe"}); !ok {
		t.Errorf("a daemon in its container whose environment is out of reach: not running (%s), want it adopted", why)
	}
	if ok, _ := running(proc, binary, checkpoint.MPSDaemon{PID: 100, StartTicks: ticks, PipeDir: "/state/mps/aaaa/pipe"}); ok {
		t.Error("a child daemon whose environment is out of reach: running, want it not adopted")
	}
}

// TestDaemonSecurity: a daemon pod is privileged where the plugin is, as
// on nodes with GPUs; elsewhere it may only change user, to start each
// server as its clients' user.
func TestDaemonSecurity(t *testing.T) {
	unprivileged := &corev1.SecurityContext{
		RunAsUser:                ptr.To[int64](0),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}},
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
	for _, tc := range []struct {
		name   string
		plugin *corev1.SecurityContext
		want   *corev1.SecurityContext
	}{
		{"privileged plugin", &corev1.SecurityContext{Privileged: ptr.To(true)}, &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), Privileged: ptr.To(true)}},
		{"unprivileged plugin", &corev1.SecurityContext{Privileged: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}, unprivileged},
		{"no security context", nil, unprivileged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, daemonSecurity(tc.plugin)); diff != "" {
				t.Errorf("daemon's security context (-want +got):\n%s", diff)
			}
		})
	}
}

// recorded says whether the stand-in's record holds a daemon command.
func recorded(t *testing.T, record, command string) bool {
	t.Helper()
	for _, e := range mpstest.Read(t, record) {
		if e.Event == "command" && len(e.Command) >= len(command) && e.Command[:len(command)] == command {
			return true
		}
	}
	return false
}

func waitDead(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still runs", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
