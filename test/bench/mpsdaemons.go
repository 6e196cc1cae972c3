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

package bench

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/test/testbed"
)

// MPSDaemonsOptions bound the mps-daemons phase.
type MPSDaemonsOptions struct {
	PluginBin, Fleet, Dir, Repo string
	// Shares is how many shares each design prepares, one per GPU.
	Shares int
}

// mpsDesign is one way of running a share's MPS control daemon.
type mpsDesign struct {
	name, node string
	// env makes the plugin run its daemons in pods (POD_NAME and
	// POD_NAMESPACE); empty, it runs them as its children.
	env     []string
	prep    []time.Duration
	unprep  []time.Duration
	plugin  float64 // plugin RSS, MiB, with the shares prepared
	daemons float64 // daemon-side RSS, MiB, with the shares prepared
}

// MPSDaemons measures what a share's MPS control daemon costs as the
// plugin's child (the design of a plugin that runs on the host) and in a
// pod of its own (the design of a plugin in a pod, whose daemons outlive
// its container), in one run against the stand-in nvidia-cuda-mps-control:
// the latency of a share's prepare, which starts its daemon, and of its
// unprepare, which stops it; the plugin's resident memory; and the
// daemon-side resident memory, which for a pod counts its containerd shim
// and pause container too. Both plugins are the same binary; only the pod
// design has a kubelet and containerd to run its daemon pods.
func MPSDaemons(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o MPSDaemonsOptions) ([]Row, error) {
	if o.Shares <= 0 {
		o.Shares = 8
	}
	const ns = "bench-mps"
	standIn := filepath.Join(o.Dir, "stand-in", mps.ControlBinary)
	build := exec.CommandContext(ctx, "go", "build", "-o", standIn, "./test/tools/fake-mps-control")
	build.Dir = o.Repo
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build the stand-in %s: %w\n%s", mps.ControlBinary, err, out)
	}
	ro, err := recipe.DefaultOptions(o.Repo)
	if err != nil {
		return nil, err
	}
	ro.Repository, ro.Simulation = "localhost/prism-bench", true
	images, err := recipe.Build(ctx, ro, []string{"pause", "prism-kubelet-plugin"}, func(name string) string { return filepath.Join(o.Dir, "images", name+".tar") })
	if err != nil {
		return nil, fmt.Errorf("build the images: %w", err)
	}
	node, err := c.AddNode(ctx, testbed.NodeOptions{Name: "bench-mps", Containerd: &testbed.ContainerdOptions{
		Images: []string{images[0].Path, images[1].Path}, SandboxImage: images[0].Ref,
	}})
	if err != nil {
		return nil, err
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	// The pod a plugin in a pod would run in, unprivileged as on a node
	// with simulated GPUs: its daemon pods are made like it.
	self := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "prism-kubelet-plugin", Namespace: ns, Labels: map[string]string{"app.kubernetes.io/instance": "bench"}},
		Spec: corev1.PodSpec{NodeName: node.Name, HostNetwork: true, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "kubelet-plugin", Image: images[1].Ref, ImagePullPolicy: corev1.PullNever,
				Command:         []string{"sleep", "86400"},
				SecurityContext: &corev1.SecurityContext{RunAsUser: ptr.To[int64](0), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}},
	}
	if _, err := client.CoreV1().Pods(ns).Create(ctx, self, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if err := CreateReadyNode(ctx, client, "bench-mps-child", nil); err != nil {
		return nil, err
	}
	designs := []*mpsDesign{
		{name: "child of the plugin", node: "bench-mps-child"},
		{name: "pod of its own", node: node.Name, env: []string{"POD_NAME=" + self.Name, "POD_NAMESPACE=" + ns}},
	}
	for _, d := range designs {
		if err := d.run(ctx, c, client, o, ns, standIn); err != nil {
			return nil, fmt.Errorf("daemons as %s: %w", d.name, err)
		}
	}
	child, pod := designs[0], designs[1]
	cse := fmt.Sprintf("%d shares of 8 simulated H100s, each with a daemon of its own, stand-in %s", o.Shares, mps.ControlBinary)
	return []Row{
		NewRow("mps-daemons", cse, "NodePrepareResources of a share, p50", "ms", child.name, ms(Percentile(child.prep, 0.5)), pod.name, ms(Percentile(pod.prep, 0.5)), "starts the share's daemon and sets its limits"),
		NewRow("mps-daemons", cse, "NodePrepareResources of a share, max", "ms", child.name, ms(Percentile(child.prep, 1)), pod.name, ms(Percentile(pod.prep, 1)), ""),
		NewRow("mps-daemons", cse, "NodeUnprepareResources of a share, p50", "ms", child.name, ms(Percentile(child.unprep, 0.5)), pod.name, ms(Percentile(pod.unprep, 0.5)), "the daemon quits; its pod is deleted"),
		NewRow("mps-daemons", cse, "plugin RSS with the shares prepared (VmRSS)", "MiB", child.name, child.plugin, pod.name, pod.plugin, ""),
		NewRow("mps-daemons", cse, "daemon-side RSS per share (VmRSS)", "MiB", child.name, child.daemons/float64(o.Shares), pod.name, pod.daemons/float64(o.Shares),
			"a pod's counts its containerd shim and pause container; the stand-in daemon's own is not a real daemon's"),
	}, nil
}

// run starts a plugin of the design with the stand-in in its driver root,
// prepares o.Shares shares one after another, measures memory with all of
// them prepared, and unprepares them.
func (d *mpsDesign) run(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o MPSDaemonsOptions, ns, standIn string) error {
	dir := filepath.Join(o.Dir, d.node)
	bin := filepath.Join(dir, "state", "fake-driver-root", "usr", "bin", mps.ControlBinary)
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		return err
	}
	if err := copyExecutable(standIn, bin); err != nil {
		return err
	}
	claims := make([]*resourceapi.ResourceClaim, o.Shares)
	for i := range claims {
		var err error
		if claims[i], err = createShareClaim(ctx, client, ns, fmt.Sprintf("%s-%d", d.node, i), d.node, i%8); err != nil {
			return err
		}
	}
	p, err := StartPluginWithEnv(ctx, c, o.PluginBin, d.node, dir, o.Fleet, d.env)
	if err != nil {
		return err
	}
	defer func() { _ = p.Stop(5 * time.Second) }()
	if _, err := p.WaitReady(ctx, time.Minute); err != nil {
		return err
	}
	conn, err := grpc.NewClient("unix://"+p.Socket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	dra := drapb.NewDRAPluginClient(conn)
	for _, cl := range claims {
		start := time.Now()
		if err := prepareClaims(ctx, dra, []*resourceapi.ResourceClaim{cl}); err != nil {
			return fmt.Errorf("%w (log %s)", err, p.LogPath)
		}
		d.prep = append(d.prep, time.Since(start))
	}
	if d.plugin, err = RSSMiB(p.Pid()); err != nil {
		return err
	}
	daemons, procs, err := daemonTrees(filepath.Join(dir, "state", "mps"), d.env != nil)
	if err != nil {
		return err
	}
	if len(daemons) != o.Shares {
		return fmt.Errorf("%d MPS daemons found for %d shares (log %s)", len(daemons), o.Shares, p.LogPath)
	}
	for _, pid := range procs {
		rss, err := RSSMiB(pid)
		if err != nil {
			return err
		}
		d.daemons += rss
	}
	for _, cl := range claims {
		start := time.Now()
		if err := unprepareClaims(ctx, dra, []*resourceapi.ResourceClaim{cl}); err != nil {
			return fmt.Errorf("%w (log %s)", err, p.LogPath)
		}
		d.unprep = append(d.unprep, time.Since(start))
	}
	return nil
}

// daemonTrees finds the MPS control daemons whose pipe directories are
// under root, and the processes that run them: each daemon, and, for a
// daemon in a pod, the containerd shim that runs it and the shim's other
// children (the pod's pause container).
func daemonTrees(root string, inPods bool) (daemons, procs []int, err error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, nil, err
	}
	parent := map[int]int{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// The fields after the command name, which may hold spaces.
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(fields) > 1 {
			parent[pid], _ = strconv.Atoi(fields[1])
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		argv := strings.Split(string(cmdline), "\x00")
		if filepath.Base(argv[0]) != mps.ControlBinary || len(argv) < 2 || argv[1] != "-f" {
			continue
		}
		environ, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if bytes.Contains(environ, []byte(mps.EnvPipeDirectory+"="+root+"/")) {
			daemons = append(daemons, pid)
		}
	}
	if !inPods {
		return daemons, daemons, nil
	}
	shims := map[int]bool{}
	for _, pid := range daemons {
		shims[parent[pid]] = true
	}
	for pid, ppid := range parent {
		if shims[pid] || shims[ppid] {
			procs = append(procs, pid)
		}
	}
	return daemons, procs, nil
}
