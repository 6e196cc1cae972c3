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
	"fmt"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// A container runtime kills every process of a container that stops, so a
// daemon started by a plugin that runs in a pod would end with the plugin's
// container: on a crash, a restart or an upgrade, and every running share
// would lose its server. There, each daemon runs in a pod of its own on the
// plugin's node instead, created by the plugin through the API server and
// bound to the node by name (no scheduling round). The pod lives until the
// share is unprepared, whatever happens to the plugin's pod, and the
// plugin that comes next adopts it from the checkpoint as it would adopt a
// child (by PID, start time, program and pipe directory, read in the
// host's /proc), and only if it runs in the pod's container.
const (
	// ComponentLabel and DaemonComponent mark the daemon pods, so that
	// `kubectl get pods -l app.kubernetes.io/component=mps-daemon` lists
	// them.
	ComponentLabel  = "app.kubernetes.io/component"
	DaemonComponent = "mps-daemon"
	// DaemonAnnotation names the daemon a pod runs (its key), gpuAnnotation
	// the GPU it serves, for people.
	DaemonAnnotation = "gpu.prism.dev/mps-daemon"
	gpuAnnotation    = "gpu.prism.dev/mps-gpu"
	daemonContainer  = "mps-control"
)

// Pods run each daemon in a pod of its own (see above). The plugin fills
// them in from its own pod, so that the daemons run where, as whom and
// from what image the plugin does.
type Pods struct {
	Client kubernetes.Interface
	// Namespace is the plugin's; Node is the node both run on.
	Namespace, Node string
	// Image is the plugin's own image, which only provides the daemon's
	// root file system: the control binary and the libraries it loads
	// come from the driver root.
	Image       string
	PullPolicy  corev1.PullPolicy
	PullSecrets []corev1.LocalObjectReference
	// PriorityClassName is the plugin's, so that a daemon is evicted no
	// sooner than the plugin.
	PriorityClassName string
	// Labels are the plugin's pod's identifying labels (name, instance);
	// ComponentLabel is set to DaemonComponent over them.
	Labels map[string]string
	// SecurityContext is the daemon container's (see daemonSecurity).
	SecurityContext *corev1.SecurityContext
	// HostDriverRoot is where the driver root is on the host; the daemon's
	// container mounts it where the plugin has it (Options.DriverRoot).
	HostDriverRoot string
}

func (p *Pods) selector() labels.Selector {
	return labels.SelectorFromSet(p.podLabels())
}

func (p *Pods) podLabels() map[string]string {
	l := map[string]string{}
	for k, v := range p.Labels {
		l[k] = v
	}
	l[ComponentLabel] = DaemonComponent
	return l
}

// daemonPod is the pod that runs the daemon recorded under key: argv with
// env, the driver root mounted read-only where the plugin has it, the
// daemon's directories (its pipe and log directories) where the plugin has
// them, and its shared-memory directory as /dev/shm.
func (p *Pods) daemonPod(key string, rec checkpoint.MPSDaemon, driverRoot string, argv, env []string) *corev1.Pod {
	var vars []corev1.EnvVar
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		vars = append(vars, corev1.EnvVar{Name: k, Value: v})
	}
	dir := filepath.Dir(rec.PipeDir)
	hostPath := func(name, path string, t corev1.HostPathType) corev1.Volume {
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: path, Type: ptr.To(t)}}}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "prism-mps-",
			Namespace:    p.Namespace,
			Labels:       p.podLabels(),
			Annotations:  map[string]string{DaemonAnnotation: key, gpuAnnotation: rec.UUID},
		},
		Spec: corev1.PodSpec{
			NodeName:      p.Node,
			RestartPolicy: corev1.RestartPolicyNever,
			// The daemon uses no network; on the host's it needs no CNI.
			HostNetwork:                  true,
			PriorityClassName:            p.PriorityClassName,
			ImagePullSecrets:             p.PullSecrets,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			// Its clients run wherever their pods may: a taint that keeps
			// new pods off the node must not end the server of those there.
			Tolerations: []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			// The plugin asks it to quit first; a pod deleted after that
			// has nothing left to wait for.
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name:            daemonContainer,
				Image:           p.Image,
				ImagePullPolicy: p.PullPolicy,
				Command:         argv,
				Env:             vars,
				SecurityContext: p.SecurityContext,
				VolumeMounts: []corev1.VolumeMount{
					{Name: "driver-root", MountPath: driverRoot, ReadOnly: true},
					{Name: "daemon", MountPath: dir},
					{Name: "shm", MountPath: devShm},
				},
			}},
			Volumes: []corev1.Volume{
				hostPath("driver-root", p.HostDriverRoot, corev1.HostPathDirectory),
				hostPath("daemon", dir, corev1.HostPathDirectory),
				hostPath("shm", rec.ShmDir, corev1.HostPathDirectory),
			},
		},
	}
}

// create creates the daemon's pod and returns its name.
func (p *Pods) create(ctx context.Context, pod *corev1.Pod) (string, error) {
	created, err := p.Client.CoreV1().Pods(p.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("create the daemon's pod in namespace %s: %w", p.Namespace, err)
	}
	return created.Name, nil
}

// waitContainer waits, within timeout, until the kubelet reports the
// running container of the daemon's pod, and returns its ID without the
// runtime's prefix.
func (p *Pods) waitContainer(ctx context.Context, name string, timeout time.Duration) (string, error) {
	var id, why string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			why = err.Error()
			return false, nil
		}
		for _, s := range pod.Status.ContainerStatuses {
			if s.Name == daemonContainer && s.State.Running != nil && s.ContainerID != "" {
				_, id, _ = strings.Cut(s.ContainerID, "://")
				return true, nil
			}
		}
		why = fmt.Sprintf("it is %s%s", pod.Status.Phase, containerState(pod))
		return false, nil
	})
	if err != nil {
		return "", fmt.Errorf("the kubelet reported no running container of the MPS daemon's pod %s/%s within %s: %s", p.Namespace, name, timeout, why)
	}
	return id, nil
}

// ended says whether the daemon's pod has ended or gone, and why, with
// what keeps a pending one from starting, for the error of a daemon that
// does not listen.
func (p *Pods) ended(ctx context.Context, name string) (bool, string) {
	pod, err := p.Client.CoreV1().Pods(p.Namespace).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, "its pod " + name + " was deleted"
	case err != nil:
		return false, err.Error()
	case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
		return true, fmt.Sprintf("its pod %s has ended (%s)%s", name, pod.Status.Phase, containerState(pod))
	}
	return false, fmt.Sprintf("its pod %s is %s%s", name, pod.Status.Phase, containerState(pod))
}

func containerState(pod *corev1.Pod) string {
	for _, s := range pod.Status.ContainerStatuses {
		switch {
		case s.State.Waiting != nil:
			return fmt.Sprintf(": %s %s", s.State.Waiting.Reason, s.State.Waiting.Message)
		case s.State.Terminated != nil:
			return fmt.Sprintf(": exit code %d %s %s", s.State.Terminated.ExitCode, s.State.Terminated.Reason, s.State.Terminated.Message)
		}
	}
	return ""
}

// delete deletes a daemon's pod at once; one already gone is no error.
func (p *Pods) delete(ctx context.Context, name string) error {
	err := p.Client.CoreV1().Pods(p.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete the MPS daemon's pod %s/%s: %w", p.Namespace, name, err)
	}
	return nil
}

// list lists the daemon pods on the node.
func (p *Pods) list(ctx context.Context) ([]corev1.Pod, error) {
	list, err := p.Client.CoreV1().Pods(p.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: p.selector().String(),
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.Node).String(),
	})
	if err != nil {
		return nil, fmt.Errorf("list the MPS daemon pods of node %s: %w", p.Node, err)
	}
	return list.Items, nil
}

// PodsLike makes Pods that run each daemon as self, the plugin's own pod,
// runs its first container: in its namespace and on its node, from its
// image, with its priority and security context. hostDriverRoot is where
// the driver root is on the host.
func PodsLike(self *corev1.Pod, client kubernetes.Interface, hostDriverRoot string) (*Pods, error) {
	if self.Spec.NodeName == "" || len(self.Spec.Containers) == 0 {
		return nil, fmt.Errorf("pod %s/%s has no node or no container to run MPS daemons like", self.Namespace, self.Name)
	}
	c := self.Spec.Containers[0]
	p := &Pods{
		Client:            client,
		Namespace:         self.Namespace,
		Node:              self.Spec.NodeName,
		Image:             c.Image,
		PullPolicy:        c.ImagePullPolicy,
		PullSecrets:       self.Spec.ImagePullSecrets,
		PriorityClassName: self.Spec.PriorityClassName,
		SecurityContext:   daemonSecurity(c.SecurityContext),
		HostDriverRoot:    hostDriverRoot,
		Labels:            map[string]string{},
	}
	for _, k := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance"} {
		if v, ok := self.Labels[k]; ok {
			p.Labels[k] = v
		}
	}
	return p, nil
}

// daemonSecurity is the daemon container's security context, from the
// plugin container's: privileged where the plugin is, as on nodes with
// GPUs, whose device nodes the daemon's servers open. Elsewhere it keeps
// only what a control daemon needs to start each server as its clients'
// user (setuid and setgid).
func daemonSecurity(plugin *corev1.SecurityContext) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{RunAsUser: ptr.To[int64](0)}
	if plugin != nil && ptr.Deref(plugin.Privileged, false) {
		sc.Privileged = ptr.To(true)
		return sc
	}
	sc.Capabilities = &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: []corev1.Capability{"SETUID", "SETGID"}}
	sc.AllowPrivilegeEscalation = ptr.To(false)
	sc.ReadOnlyRootFilesystem = ptr.To(true)
	sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	return sc
}
