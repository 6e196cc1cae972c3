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
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/klog/v2"
	"sigs.k8s.io/yaml"
)

// Node is a real kubelet registered with the cluster, running against a fake
// CRI runtime that lives in this process, or against containerd.
type Node struct {
	Name string
	// Dir holds the node's state; RootDir is the kubelet's --root-dir.
	Dir     string
	RootDir string
	// Runtime is the fake CRI, nil when Containerd runs the pods.
	Runtime    *FakeRuntime
	Containerd *Containerd

	stopLogs context.CancelFunc
	logsDone <-chan struct{}

	cluster *Cluster
	mu      sync.Mutex
	kubelet *Process
	// startedAt is when the current kubelet started; a Ready condition from
	// before it belongs to the previous one.
	startedAt time.Time
}

// NodeOptions configure one node.
type NodeOptions struct {
	// Name of the Node object. The first node is best called "localhost": the
	// apiserver reaches kubelets by hostname, so `kubectl logs` works there.
	Name string
	// Labels are added to the Node at registration.
	Labels map[string]string
	// Containerd, when set, runs the node's pods in real containers.
	Containerd *ContainerdOptions
}

// kubelet hard-codes a few host paths (the device-plugin socket directory,
// container log symlinks). Each kubelet gets private tmpfs copies of them in its
// own mount namespace, which also drops every mount it makes when it exits.
var kubeletPrivateDirs = []string{"/var/lib/kubelet", "/var/log/containers", "/var/log/pods"}

// AddNode starts a kubelet and waits for its Node to be Ready.
func (c *Cluster) AddNode(ctx context.Context, opts NodeOptions) (*Node, error) {
	if opts.Name == "" {
		return nil, fmt.Errorf("add node: a name is required")
	}
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("add node %s: the kubelet needs root (it mounts and manages cgroups); run as root", opts.Name)
	}
	private := kubeletPrivateDirs
	if opts.Containerd != nil {
		private = append(slices.Clone(private), containerdPrivateDirs...)
	}
	c.mu.Lock()
	if !c.holdsHostDirs {
		hostDirs.hold()
		c.holdsHostDirs = true
	}
	c.mu.Unlock()
	if err := hostDirs.prepare(private); err != nil {
		return nil, fmt.Errorf("add node %s: %w", opts.Name, err)
	}
	n := &Node{Name: opts.Name, cluster: c, Dir: filepath.Join(c.opts.WorkDir, "nodes", opts.Name)}
	n.RootDir = filepath.Join(n.Dir, "kubelet")
	for _, d := range []string{n.RootDir, filepath.Join(n.Dir, "cwd"), filepath.Join(n.Dir, "pod-logs"), filepath.Join(n.Dir, "volume-plugins")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("add node %s: %w", opts.Name, err)
		}
	}
	criSocket := filepath.Join(n.Dir, "cri.sock")
	if opts.Containerd != nil {
		ctrd, err := startContainerd(ctx, n, *opts.Containerd)
		if err != nil {
			return nil, fmt.Errorf("add node %s: %w", opts.Name, err)
		}
		n.Containerd, criSocket = ctrd, ctrd.Socket
		logCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		n.stopLogs, n.logsDone = cancel, keepContainerLogs(logCtx, filepath.Join(n.Dir, "pod-logs"), filepath.Join(c.opts.WorkDir, "logs"))
	} else {
		rt, err := StartFakeRuntime(criSocket)
		if err != nil {
			return nil, fmt.Errorf("add node %s: %w", opts.Name, err)
		}
		n.Runtime = rt
	}
	if err := n.writeKubeletConfig(opts, criSocket); err != nil {
		n.Stop(ctx)
		return nil, err
	}
	if err := n.StartKubelet(ctx); err != nil {
		n.Stop(ctx)
		return nil, err
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	if err := n.WaitReady(ctx, 2*time.Minute); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) writeKubeletConfig(opts NodeOptions, criSocket string) error {
	port, err := FreePort()
	if err != nil {
		return err
	}
	healthzPort, err := FreePort()
	if err != nil {
		return err
	}
	cfg := map[string]any{
		"apiVersion":                  "kubelet.config.k8s.io/v1beta1",
		"kind":                        "KubeletConfiguration",
		"address":                     "127.0.0.1",
		"port":                        port,
		"readOnlyPort":                0,
		"healthzBindAddress":          "127.0.0.1",
		"healthzPort":                 healthzPort,
		"containerRuntimeEndpoint":    "unix://" + criSocket,
		"imageServiceEndpoint":        "unix://" + criSocket,
		"authentication":              map[string]any{"anonymous": map[string]any{"enabled": false}, "webhook": map[string]any{"enabled": true}},
		"authorization":               map[string]any{"mode": "AlwaysAllow"},
		"failCgroupV1":                false,
		"failSwapOn":                  false,
		"cgroupDriver":                "cgroupfs",
		"cgroupsPerQOS":               false,
		"enforceNodeAllocatable":      []string{},
		"imageGCHighThresholdPercent": 100,
		"imageGCLowThresholdPercent":  99,
		"resolvConf":                  "",
		"podLogsDir":                  filepath.Join(n.Dir, "pod-logs"),
		"volumePluginDir":             filepath.Join(n.Dir, "volume-plugins"),
		"nodeStatusReportFrequency":   "10s",
		"syncFrequency":               "10s",
		// The host's free disk is not the test's concern; only evict when memory runs out.
		"evictionHard": map[string]string{"memory.available": "100Mi"},
	}
	if len(n.cluster.opts.FeatureGates) > 0 {
		cfg["featureGates"] = n.cluster.opts.FeatureGates
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(n.Dir, "kubelet-config.yaml"), data, 0o644); err != nil {
		return err
	}
	var labels []string
	for k, v := range opts.Labels {
		labels = append(labels, k+"="+v)
	}
	args := []string{
		"--config=" + filepath.Join(n.Dir, "kubelet-config.yaml"),
		"--kubeconfig=" + n.cluster.KubeconfigPath,
		"--root-dir=" + n.RootDir,
		"--cert-dir=" + filepath.Join(n.Dir, "pki"),
		"--hostname-override=" + n.Name,
		"--v=2",
	}
	if len(labels) > 0 {
		args = append(args, "--node-labels="+strings.Join(labels, ","))
	}
	return os.WriteFile(filepath.Join(n.Dir, "kubelet.args"), []byte(strings.Join(args, "\n")), 0o644)
}

// StartKubelet starts (or restarts) the node's kubelet.
func (n *Node) StartKubelet(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil {
		if exited, _ := n.kubelet.Exited(); !exited {
			return fmt.Errorf("kubelet on %s is already running", n.Name)
		}
	}
	rawArgs, err := os.ReadFile(filepath.Join(n.Dir, "kubelet.args"))
	if err != nil {
		return err
	}
	script := "set -e\nfor d in " + strings.Join(kubeletPrivateDirs, " ") + "; do mount -t tmpfs tmpfs \"$d\"; done\nexec \"$@\"\n"
	wrapper, args := "unshare", []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "kubelet"}
	if n.Containerd != nil {
		// containerd's mount namespace already has the private directories.
		wrapper, args = "nsenter", []string{"--mount=" + n.Containerd.mountNamespace(), "--"}
	}
	args = append(append(args, n.cluster.BinPath("kubelet")), strings.Split(string(rawArgs), "\n")...)
	p, err := StartProcess(ctx, "kubelet-"+n.Name, filepath.Join(n.Dir, "cwd"),
		filepath.Join(n.cluster.opts.WorkDir, "logs", "kubelet-"+n.Name+".log"), wrapper, args...)
	if err != nil {
		return err
	}
	n.kubelet = p
	// Heartbeats have one-second resolution.
	n.startedAt = time.Now().Truncate(time.Second)
	return nil
}

// StopKubelet stops the kubelet, leaving pods and the runtime in place, as a
// kubelet restart on a real node would.
func (n *Node) StopKubelet() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.kubelet != nil {
		_ = n.kubelet.Stop(10 * time.Second)
	}
}

// WaitReady waits for the current kubelet to report the Node Ready.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		n.mu.Lock()
		k, since := n.kubelet, n.startedAt
		n.mu.Unlock()
		if exited, err := k.Exited(); exited {
			return false, fmt.Errorf("kubelet exited (%v), see %s", err, k.LogPath)
		}
		node, err := n.cluster.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			last = "not registered"
			return false, nil
		}
		if err != nil {
			return false, err
		}
		for _, cond := range node.Status.Conditions {
			if cond.Type == corev1.NodeReady {
				last = fmt.Sprintf("Ready=%s at %s: %s", cond.Status, cond.LastHeartbeatTime, cond.Message)
				return cond.Status == corev1.ConditionTrue && !cond.LastHeartbeatTime.Time.Before(since), nil
			}
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("wait for node %s to be Ready (last: %s, log %s): %w", n.Name, last, n.kubelet.LogPath, err)
	}
	return nil
}

// RegistrarDir is where DRA plugins put their registration sockets.
func (n *Node) RegistrarDir() string { return filepath.Join(n.RootDir, "plugins_registry") }

// PluginDir is the data directory of the named DRA driver on this node.
func (n *Node) PluginDir(driver string) string { return filepath.Join(n.RootDir, "plugins", driver) }

// Stop stops the kubelet and the runtime; containerd takes its pods with it.
func (n *Node) Stop(ctx context.Context) {
	n.StopKubelet()
	if n.Runtime != nil {
		n.Runtime.Stop()
	}
	if n.Containerd != nil {
		n.Containerd.Stop(ctx)
		n.stopLogs()
		<-n.logsDone
	}
	klog.FromContext(ctx).V(2).Info("Stopped node", "node", n.Name)
}

// hostDirs records which of the kubelet's hard-coded host directories the test
// bed had to create as mount points, so that it removes exactly those. It
// is shared by every cluster of the process and removes them only when the
// last cluster holding them stops: a kubelet's private mount on a directory
// goes with the directory, and one cluster may still be stopping while the
// next one runs.
var hostDirs hostDirRegistry

type hostDirRegistry struct {
	mu      sync.Mutex
	holders int
	created []string
}

// hold counts a cluster that uses the directories until it calls release.
func (hd *hostDirRegistry) hold() {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	hd.holders++
}

func (hd *hostDirRegistry) prepare(dirs []string) error {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			continue
		}
		// Record the topmost directory that did not exist yet.
		top := d
		for p := filepath.Dir(d); p != "/"; p = filepath.Dir(p) {
			if _, err := os.Stat(p); err == nil {
				break
			}
			top = p
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create mount point %s: %w", d, err)
		}
		hd.created = append(hd.created, top)
	}
	return nil
}

// release ends a hold; the last one removes the directories created.
func (hd *hostDirRegistry) release(ctx context.Context) {
	hd.mu.Lock()
	defer hd.mu.Unlock()
	if hd.holders--; hd.holders > 0 {
		return
	}
	for i := len(hd.created) - 1; i >= 0; i-- {
		// The directories are only mount points; RemoveAll of a non-empty one
		// would mean something else wrote there, so only remove empty trees.
		if err := removeEmptyTree(hd.created[i]); err != nil {
			klog.FromContext(ctx).Info("Leaving host directory in place", "dir", hd.created[i], "reason", err.Error())
		}
	}
	hd.created = nil
}

func removeEmptyTree(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() {
			return fmt.Errorf("%s is not empty", dir)
		}
		if err := removeEmptyTree(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return os.Remove(dir)
}
