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

// Package bed turns a test-bed cluster into a Prism demo environment: it
// installs what the Helm chart renders that a host-process setup needs
// (CRDs, DeviceClasses, RBAC), adds heterogeneous GPU nodes each with a
// prism-kubelet-plugin on a simulated fleet, and runs prism-controller with
// its webhooks registered by URL on loopback. The prism-demo daemon and the
// demo e2e test both use it.
package bed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/test/testbed"
)

// NodeSpec is one simulated GPU node.
type NodeSpec struct {
	Name  string
	Fleet string // file name in demo/fleets
	// MIGPartitions starts the node's plugin with the MIGPartitions gate,
	// so that it publishes the partitions of its GPUs in MIG mode. The bed
	// then installs the DeviceClasses the chart renders with that gate.
	MIGPartitions bool
}

// DefaultNodes are the demo's nodes of whole GPUs, one per model; the
// controller's e2e tests run on them.
var DefaultNodes = []NodeSpec{
	{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"},
	{Name: "gpu-a100", Fleet: "a100-40gb-8.yaml"},
	{Name: "gpu-l4", Fleet: "l4-4.yaml"},
}

// DemoNodes are the nodes of `make demo` and TestDemo: DefaultNodes, and
// gpu-mig, whose two A100s are in MIG mode. Partitions need Kubernetes
// 1.36 or later (DRAPartitionableDevices); on older releases gpu-mig
// publishes whole GPUs only.
var DemoNodes = append(slices.Clip(DefaultNodes), NodeSpec{Name: "gpu-mig", Fleet: "a100-40gb-mig-2.yaml", MIGPartitions: true})

// PluginBuildTags build a prism-kubelet-plugin that the bed can run: a
// test build, which has --fleet and --simulated-faults. The release build
// has neither and refuses to start without GPUs.
const PluginBuildTags = "simulation"

// Options configure Setup.
type Options struct {
	// RepoRoot holds deployments/ and demo/fleets.
	RepoRoot string
	// PluginBin and ControllerBin are the Prism binaries to run; the
	// plugin built with PluginBuildTags.
	PluginBin, ControllerBin string
	// NCUDir holds an executable named ncu (test/tools/fake-ncu); it makes
	// profiled claims work. Empty disables profiling.
	NCUDir string
	// MPSControl is an executable (test/tools/fake-mps-control) installed
	// as each node's nvidia-cuda-mps-control, which makes the plugins
	// enforce GPU shares with MPS; empty: shares run time-sliced.
	MPSControl string
	// PluginFlags are added to every prism-kubelet-plugin's command line.
	PluginFlags []string
	// Nodes default to DefaultNodes.
	Nodes []NodeSpec
	// ChartSets are helm --set values (KEY=VALUE) to render the chart with,
	// on top of the demo values, for the RBAC and webhooks the bed installs;
	// empty: deployments/static/prism.yaml as it is. Rendering needs the
	// test bed's helm.
	ChartSets []string
	// ControllerFlags are added to prism-controller's command line.
	ControllerFlags []string
	// ControllerReplicas run behind one loopback front, as behind the
	// chart's Service; 0 means 1. With several, KillServingController
	// plays a replica's crash.
	ControllerReplicas int
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// Bed is a running demo environment.
type Bed struct {
	Cluster *testbed.Cluster
	// StateDirs maps node name to its plugin's --state-dir.
	StateDirs map[string]string
	// FaultsFiles maps node name to its plugin's --simulated-faults file:
	// a JSON line appended to it is raised as an NVML Xid event (RaiseXID).
	FaultsFiles map[string]string
	// UsageFiles maps node name to the usage file of its simulated GPUs:
	// what nvml.WriteUsage writes there is what NVML shows the plugin.
	UsageFiles map[string]string
	log        io.Writer
	// mu guards the maps and the log while Setup starts the nodes
	// concurrently.
	mu sync.Mutex
	// plugins and controllers keep what it takes to start each again.
	plugins     map[string]*component
	controllers []*component
	// front is the webhooks' address when several controller replicas
	// serve them; serving indexes the replica it sends connections to.
	front   *testbed.Proxy
	serving int
}

// component is one Prism process of the bed and how to start it again.
type component struct {
	name, bin, dir, logPath string
	args                    []string
	proc                    *testbed.Process
	// ready tells whether the running process serves, once it has started.
	ready func(ctx context.Context) (bool, error)
	addr  string
}

func (c *component) start(ctx context.Context) error {
	proc, err := testbed.StartProcess(ctx, c.name, c.dir, c.logPath, c.bin, c.args...)
	if err != nil {
		return err
	}
	c.proc = proc
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := proc.Exited(); exited {
			return false, fmt.Errorf("%s exited: %v (log %s)", c.name, err, c.logPath)
		}
		return c.ready(ctx)
	})
}

// CRDDirs are the CRD directories to pass to testbed.Start.
func CRDDirs(repoRoot string) []string {
	return []string{filepath.Join(repoRoot, "deployments", "crds")}
}

func (b *Bed) logf(format string, args ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	fmt.Fprintf(b.log, "[prism-demo] "+format+"\n", args...)
}

// Setup installs Prism into a running test-bed cluster. On error, what was
// started is stopped again (the cluster itself is the caller's).
func Setup(ctx context.Context, c *testbed.Cluster, opts Options) (_ *Bed, err error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	if len(opts.Nodes) == 0 {
		opts.Nodes = DefaultNodes
	}
	b := &Bed{Cluster: c, StateDirs: map[string]string{}, FaultsFiles: map[string]string{}, UsageFiles: map[string]string{}, log: opts.Log, plugins: map[string]*component{}}
	defer func() {
		if err != nil {
			b.Stop()
		}
	}()
	docs, err := manifest(ctx, c, opts.RepoRoot, opts.ChartSets)
	if err != nil {
		return nil, err
	}
	if err := b.installManifests(ctx, opts.RepoRoot, docs, slices.ContainsFunc(opts.Nodes, func(n NodeSpec) bool { return n.MIGPartitions })); err != nil {
		return nil, err
	}
	// The nodes are independent, and each waits mostly on its kubelet and
	// plugin becoming ready, so they start side by side.
	var nodes errgroup.Group
	for _, n := range opts.Nodes {
		nodes.Go(func() error {
			start := time.Now()
			node, err := c.AddNode(ctx, testbed.NodeOptions{Name: n.Name})
			if err != nil {
				return err
			}
			fleet, err := b.nodeFleet(node, filepath.Join(opts.RepoRoot, "demo", "fleets", n.Fleet))
			if err != nil {
				return err
			}
			if err := b.startPlugin(ctx, node, fleet, n.MIGPartitions, opts); err != nil {
				return err
			}
			b.logf("node %-9s ready with prism-kubelet-plugin on fleet %s (%s)", n.Name, n.Fleet, time.Since(start).Round(100*time.Millisecond))
			return nil
		})
	}
	if err := nodes.Wait(); err != nil {
		return nil, err
	}
	start := time.Now()
	if err := b.startController(ctx, opts, docs); err != nil {
		return nil, err
	}
	b.logf("prism-controller ready, webhooks prism-rewrite and prism-validate registered (%s)", time.Since(start).Round(100*time.Millisecond))
	return b, nil
}

// Stop stops the controller and the plugins, newest first. The cluster is
// the caller's to stop.
func (b *Bed) Stop() {
	for i := len(b.controllers) - 1; i >= 0; i-- {
		_ = b.controllers[i].proc.Stop(5 * time.Second)
	}
	b.controllers = nil
	if b.front != nil {
		_ = b.front.Close()
		b.front = nil
	}
	for _, p := range b.plugins {
		_ = p.proc.Stop(5 * time.Second)
	}
	clear(b.plugins)
}

// PluginPID is the process ID of node's prism-kubelet-plugin, 0 if the
// node has none.
func (b *Bed) PluginPID(node string) int {
	if p, ok := b.plugins[node]; ok {
		return p.proc.Pid()
	}
	return 0
}

// KillPlugin SIGKILLs node's prism-kubelet-plugin, as the OOM killer or a
// crash would, and starts it again as its DaemonSet would; it returns once
// the new one is ready and its slice is published.
func (b *Bed) KillPlugin(ctx context.Context, node string) error {
	p, ok := b.plugins[node]
	if !ok {
		return fmt.Errorf("no prism-kubelet-plugin on node %q", node)
	}
	p.proc.Kill()
	return p.start(ctx)
}

// RestartPluginContainer SIGKILLs node's prism-kubelet-plugin with every
// process a container of it would hold, as a container restart or a
// helm upgrade does: the MPS control daemons it started and their servers.
// Then it starts the plugin again, as KillPlugin does.
func (b *Bed) RestartPluginContainer(ctx context.Context, node string) error {
	p, ok := b.plugins[node]
	if !ok {
		return fmt.Errorf("no prism-kubelet-plugin on node %q", node)
	}
	p.proc.Kill()
	daemons, err := MPSProcesses(b.StateDirs[node])
	if err != nil {
		return err
	}
	for pid := range daemons {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return p.start(ctx)
}

// KillServingController SIGKILLs the controller replica that admission
// requests reach, points the front at the next replica, as a Service does
// once the dead pod's endpoint is gone, and starts the killed replica
// again. It needs Options.ControllerReplicas of two or more.
func (b *Bed) KillServingController(ctx context.Context) error {
	if b.front == nil {
		return errors.New("one controller replica: killing it would stop admission, not fail it over")
	}
	killed := b.controllers[b.serving]
	killed.proc.Kill()
	b.serving = (b.serving + 1) % len(b.controllers)
	b.front.SetTarget(b.controllers[b.serving].addr)
	return killed.start(ctx)
}

// HealthRecoverAfter is the plugins' --health-recover-after: short, so that
// the demo sees a tainted GPU come back.
const HealthRecoverAfter = 20 * time.Second

// FaultsFileName is the --simulated-faults file in each node's directory
// (next to its plugin's state directory).
const FaultsFileName = "faults.jsonl"

// FaultsFile is the --simulated-faults file of the plugin whose --state-dir
// is stateDir. The path is deterministic, so that a runner that knows only
// the state directories (prism-demo run against the daemon) finds it.
func FaultsFile(stateDir string) string {
	return filepath.Join(filepath.Dir(stateDir), FaultsFileName)
}

// RaiseXID makes the plugin on node see NVML report Xid xid on GPU index
// gpu, as a failing GPU would: it appends the fault to the node's
// --simulated-faults file.
func (b *Bed) RaiseXID(node string, gpu, xid int) error {
	path, ok := b.FaultsFiles[node]
	if !ok {
		return fmt.Errorf("no node %s in the demo bed", node)
	}
	return AppendFault(path, gpu, xid)
}

// AppendFault appends one simulated Xid event to a --simulated-faults file.
func AppendFault(path string, gpu, xid int) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := fmt.Fprintf(f, "{\"gpu\":%d,\"xid\":%d}\n", gpu, xid); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// installedKinds are the objects of deployments/static/prism.yaml that a
// host-process setup applies: the chart's identities, their RBAC and its
// admission policies, so that the plugins and the controller run with the
// chart's own permissions and checks.
var installedKinds = map[string]bool{
	"Namespace": true, "ServiceAccount": true, "ClusterRole": true, "ClusterRoleBinding": true, "Role": true, "RoleBinding": true,
	"ValidatingAdmissionPolicy": true, "ValidatingAdmissionPolicyBinding": true,
}

// Namespace, PluginServiceAccount and ControllerServiceAccount are the
// identities deployments/static/prism.yaml creates for Prism.
const (
	Namespace                = "prism-system"
	PluginServiceAccount     = "prism-kubelet-plugin"
	ControllerServiceAccount = "prism-controller"
)

// migGate is the chart value that turns the plugin's MIGPartitions gate on
// and renders the DeviceClasses that go with it.
const migGate = "kubeletPlugin.featureGates.MIGPartitions=true"

// ApplyDeviceClasses applies the chart's DeviceClasses: those of
// deployments/static, or, for nodes that publish MIG partitions, the
// chart's rendered with the gate, since the static file lacks the class of
// partitions and its rewrite class would let the rewrite's tiers take one.
// It returns where they came from.
func ApplyDeviceClasses(ctx context.Context, c *testbed.Cluster, repoRoot string, partitions bool) (string, error) {
	if !partitions {
		static := filepath.Join(repoRoot, "deployments", "static", "deviceclasses.yaml")
		if out, err := testbed.Kubectl(ctx, c, "apply", "-f", static); err != nil {
			return "", fmt.Errorf("apply DeviceClasses: %w\n%s", err, out)
		}
		return "deployments/static/deviceclasses.yaml", nil
	}
	classes, err := helmTemplate(ctx, c, repoRoot, "--set", migGate, "--show-only", "templates/deviceclasses.yaml")
	if err != nil {
		return "", fmt.Errorf("rendering the chart's DeviceClasses with %s: %w", migGate, err)
	}
	if err := applyDocs(ctx, c, "prism-deviceclasses.yaml", [][]byte{classes}); err != nil {
		return "", fmt.Errorf("apply DeviceClasses: %w", err)
	}
	return "the chart rendered with " + migGate, nil
}

func (b *Bed) installManifests(ctx context.Context, repoRoot string, docs []staticDoc, partitions bool) error {
	from, err := ApplyDeviceClasses(ctx, b.Cluster, repoRoot, partitions)
	if err != nil {
		return err
	}
	b.logf("applied CRDs from deployments/crds and DeviceClasses from %s", from)
	applied, skipped, err := installIdentities(ctx, b.Cluster, docs)
	if err != nil {
		return err
	}
	var kinds []string
	for k, n := range skipped {
		kinds = append(kinds, k+"×"+strconv.Itoa(n))
	}
	b.logf("applied %d Namespace/ServiceAccount/RBAC/admission-policy objects from deployments/static/prism.yaml", applied)
	b.logf("skipped from prism.yaml (the demo runs the binaries as host processes and registers the webhooks by URL): %s", strings.Join(sorted(kinds), ", "))
	return nil
}

// InstallIdentities applies the Namespace, ServiceAccounts, RBAC and
// admission policies of deployments/static/prism.yaml, and says how many
// objects it applied and which kinds it left out. Applying twice is harmless.
func InstallIdentities(ctx context.Context, c *testbed.Cluster, repoRoot string) (applied int, skipped map[string]int, err error) {
	docs, err := staticDocs(repoRoot)
	if err != nil {
		return 0, nil, err
	}
	return installIdentities(ctx, c, docs)
}

func installIdentities(ctx context.Context, c *testbed.Cluster, docs []staticDoc) (applied int, skipped map[string]int, err error) {
	var keep [][]byte
	skipped = map[string]int{}
	for _, d := range docs {
		switch {
		case installedKinds[d.kind]:
			keep = append(keep, d.raw)
		case d.kind == "CustomResourceDefinition" || d.kind == "DeviceClass":
			// Same objects as deployments/crds and deviceclasses.yaml.
		default:
			skipped[d.kind]++
		}
	}
	if err := applyDocs(ctx, c, "prism-identities.yaml", keep); err != nil {
		return 0, nil, fmt.Errorf("apply identities and RBAC from prism.yaml: %w", err)
	}
	return len(keep), skipped, nil
}

// staticDoc is one object of deployments/static/prism.yaml.
type staticDoc struct {
	kind string
	raw  []byte
}

// staticDocs reads deployments/static/prism.yaml, the chart rendered with
// the demo's values, into its objects.
func staticDocs(repoRoot string) ([]staticDoc, error) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deployments", "static", "prism.yaml"))
	if err != nil {
		return nil, err
	}
	return splitDocs(data), nil
}

// manifest is deployments/static/prism.yaml, or with sets the chart
// rendered as hack/helm-check.sh renders that file, plus the sets.
func manifest(ctx context.Context, c *testbed.Cluster, repoRoot string, sets []string) ([]staticDoc, error) {
	if len(sets) == 0 {
		return staticDocs(repoRoot)
	}
	args := []string{"--values", filepath.Join(repoRoot, "deployments", "static", "values-demo.yaml"),
		"--set-file", "simulation.fleet=" + filepath.Join(repoRoot, "demo", "fleets", "mixed.yaml")}
	for _, s := range sets {
		args = append(args, "--set", s)
	}
	out, err := helmTemplate(ctx, c, repoRoot, args...)
	if err != nil {
		return nil, fmt.Errorf("rendering the chart with %v: %w", sets, err)
	}
	// helm template renders no Namespace; hack/helm-check.sh puts it first
	// in prism.yaml, and so does this.
	static, err := staticDocs(repoRoot)
	if err != nil {
		return nil, err
	}
	var docs []staticDoc
	for _, d := range static {
		if d.kind == "Namespace" {
			docs = append(docs, d)
		}
	}
	return append(docs, splitDocs(out)...), nil
}

// helmTemplate runs the test bed's helm template on the chart, for the
// release and namespace of deployments/static, with args added.
func helmTemplate(ctx context.Context, c *testbed.Cluster, repoRoot string, args ...string) ([]byte, error) {
	args = append([]string{"template", "prism", filepath.Join(repoRoot, "deployments", "helm", "prism"), "--namespace", Namespace, "--kube-version", "1.34.0"}, args...)
	out, err := exec.CommandContext(ctx, c.BinPath("helm"), args...).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		err = fmt.Errorf("%w: %s", err, exit.Stderr)
	}
	return out, err
}

func splitDocs(data []byte) []staticDoc {
	var docs []staticDoc
	for _, raw := range bytes.Split(data, []byte("\n---")) {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal(raw, &meta); err != nil || meta.Kind == "" {
			continue
		}
		docs = append(docs, staticDoc{kind: meta.Kind, raw: raw})
	}
	return docs
}

// applyDocs writes docs to name in the cluster's work directory and applies
// them with kubectl.
func applyDocs(ctx context.Context, c *testbed.Cluster, name string, docs [][]byte) error {
	path := filepath.Join(c.WorkDir(), name)
	if err := os.WriteFile(path, bytes.Join(docs, []byte("\n---\n")), 0o644); err != nil {
		return err
	}
	if out, err := testbed.Kubectl(ctx, c, "apply", "-f", path); err != nil {
		return fmt.Errorf("%w\n%s", err, out)
	}
	return nil
}

// PluginKubeconfig is a kubeconfig for the plugin on node with the chart's
// plugin ServiceAccount and a token bound to that node, as the DaemonSet's
// pod there would have. InstallIdentities must have run.
func PluginKubeconfig(ctx context.Context, c *testbed.Cluster, node string) (string, error) {
	return c.ServiceAccountKubeconfig(ctx, Namespace, PluginServiceAccount, node)
}

// ControllerKubeconfig is a kubeconfig with the chart's controller
// ServiceAccount. InstallIdentities must have run.
func ControllerKubeconfig(ctx context.Context, c *testbed.Cluster) (string, error) {
	return c.ServiceAccountKubeconfig(ctx, Namespace, ControllerServiceAccount, "")
}

func sorted(s []string) []string { sort.Strings(s); return s }

// nodeFleet writes the node's copy of a demo fleet, naming a usage file of
// the node's own, so that a scenario can show the plugin what its GPUs'
// workloads use. A missing usage file is an idle node.
func (b *Bed) nodeFleet(node *testbed.Node, demoFleet string) (string, error) {
	data, err := os.ReadFile(demoFleet)
	if err != nil {
		return "", err
	}
	usage := filepath.Join(node.Dir, "gpu-usage.json")
	fleet := filepath.Join(node.Dir, filepath.Base(demoFleet))
	data = append(bytes.TrimRight(data, "\n"), []byte("\nusageFile: "+usage+"\n")...)
	if err := os.WriteFile(fleet, data, 0o644); err != nil {
		return "", err
	}
	b.mu.Lock()
	b.UsageFiles[node.Name] = usage
	b.mu.Unlock()
	return fleet, nil
}

// installMPSControl puts the stand-in control binary where a simulated
// node's plugin looks for the driver's: its fake driver root.
func installMPSControl(stateDir, bin string) error {
	data, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	dst := filepath.Join(stateDir, "fake-driver-root", "usr", "bin", "nvidia-cuda-mps-control")
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

func (b *Bed) startPlugin(ctx context.Context, node *testbed.Node, fleet string, partitions bool, opts Options) error {
	port, err := testbed.FreePort()
	if err != nil {
		return err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	stateDir := filepath.Join(node.Dir, "prism-state")
	faults := FaultsFile(stateDir)
	kubeconfig, err := PluginKubeconfig(ctx, b.Cluster, node.Name)
	if err != nil {
		return err
	}
	args := []string{
		"--node-name=" + node.Name,
		"--kubeconfig=" + kubeconfig,
		"--kubelet-registrar-dir=" + node.RegistrarDir(),
		"--kubelet-plugin-dir=" + node.PluginDir(gpuv1alpha1.DriverName),
		"--cdi-root=" + filepath.Join(node.Dir, "cdi"),
		"--state-dir=" + stateDir,
		"--fleet=" + fleet,
		"--http-address=" + addr,
		"--consumable-capacity",
		"--simulated-faults=" + faults,
		"--health-recover-after=" + HealthRecoverAfter.String(),
		"-v=2",
	}
	if opts.NCUDir != "" {
		args = append(args, "--ncu-path="+opts.NCUDir)
	}
	if opts.MPSControl != "" {
		if err := installMPSControl(stateDir, opts.MPSControl); err != nil {
			return fmt.Errorf("install %s on node %s: %w", opts.MPSControl, node.Name, err)
		}
	}
	if partitions {
		args = append(args, "--feature-gates=MIGPartitions=true")
	}
	if len(opts.PluginFlags) > 0 {
		args = append(args, opts.PluginFlags...)
	}
	b.mu.Lock()
	b.StateDirs[node.Name] = stateDir
	b.FaultsFiles[node.Name] = faults
	b.mu.Unlock()
	p := &component{
		name: "prism-plugin-" + node.Name, bin: opts.PluginBin, dir: node.Dir, args: args,
		logPath: filepath.Join(b.Cluster.WorkDir(), "logs", "prism-plugin-"+node.Name+".log"),
		// Ready once /readyz answers (registered, slice published) and
		// the slice is visible.
		ready: func(ctx context.Context) (bool, error) {
			resp, err := http.Get("http://" + addr + "/readyz")
			if err != nil {
				return false, nil
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return false, nil
			}
			list, err := b.Cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
				FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node.Name,
			})
			// A node with MIG partitions also publishes slices that hold
			// only counter sets.
			return err == nil && slices.ContainsFunc(list.Items, func(s resourceapi.ResourceSlice) bool { return len(s.Spec.Devices) > 0 }), nil
		},
	}
	b.mu.Lock()
	b.plugins[node.Name] = p
	b.mu.Unlock()
	return p.start(ctx)
}

// startController runs prism-controller on loopback and registers the
// chart's webhooks by URL; the controller fills in their caBundle.
func (b *Bed) startController(ctx context.Context, opts Options, docs []staticDoc) error {
	c := b.Cluster
	kubeconfig, err := ControllerKubeconfig(ctx, c)
	if err != nil {
		return err
	}
	replicas := max(opts.ControllerReplicas, 1)
	for i := range replicas {
		port, err := testbed.FreePort()
		if err != nil {
			return err
		}
		httpPort, err := testbed.FreePort()
		if err != nil {
			return err
		}
		name, certDir := "prism-controller", filepath.Join(c.WorkDir(), "webhook-certs")
		if i > 0 {
			name, certDir = fmt.Sprintf("prism-controller-%d", i), fmt.Sprintf("%s-%d", certDir, i)
		}
		args := []string{"--kubeconfig=" + kubeconfig, "--webhook-host=127.0.0.1", "--webhook-port=" + strconv.Itoa(port),
			"--extra-sans=127.0.0.1", "--cert-dir=" + certDir, "--namespace=prism-system",
			"--http-address=127.0.0.1:" + strconv.Itoa(httpPort), "--policy=performance", "-v=2"}
		if replicas > 1 {
			// Replicas on one host share its name, which would make each
			// take the other's CA for one of its own earlier containers.
			args = append(args, "--replica-name="+name)
		}
		readyz := "http://127.0.0.1:" + strconv.Itoa(httpPort) + "/readyz"
		ctrl := &component{
			name: name, bin: opts.ControllerBin, dir: c.WorkDir(), args: append(args, opts.ControllerFlags...),
			logPath: filepath.Join(c.WorkDir(), "logs", name+".log"),
			addr:    "127.0.0.1:" + strconv.Itoa(port),
			ready: func(context.Context) (bool, error) {
				resp, err := http.Get(readyz)
				if err != nil {
					return false, nil
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK, nil
			},
		}
		b.controllers = append(b.controllers, ctrl)
		if err := ctrl.start(ctx); err != nil {
			return err
		}
	}
	base := "https://" + b.controllers[0].addr
	if replicas > 1 {
		if b.front, err = testbed.StartProxy(b.controllers[0].addr, true); err != nil {
			return err
		}
		base = "https://" + b.front.Addr
	}
	if err := registerWebhooks(ctx, c, docs, base); err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, ctrl := range b.controllers {
			if exited, err := ctrl.proc.Exited(); exited {
				return false, fmt.Errorf("%s exited: %v (log %s)", ctrl.name, err, ctrl.logPath)
			}
		}
		m, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "prism-rewrite", metav1.GetOptions{})
		if err != nil || len(m.Webhooks[0].ClientConfig.CABundle) == 0 {
			return false, nil
		}
		v, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, "prism-validate", metav1.GetOptions{})
		if err != nil || len(v.Webhooks[0].ClientConfig.CABundle) == 0 {
			return false, nil
		}
		// The webhook answers: a dry-run claim that the rewrite webhook's
		// match condition sends to it is admitted.
		_, err = c.Client.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: "prism-demo-probe", Annotations: map[string]string{"prism.dev/profile": "prism-demo-probe"}},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuv1alpha1.DriverName},
			}}}},
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil, nil
	})
}

// registerWebhooks creates the chart's webhook configurations from docs
// (deployments/static/prism.yaml unless Options.ChartSets), each webhook sent to base plus the path its
// Service reference names, since the test bed has no Service network. So
// the demo and the e2e tests admit through exactly the rules, match
// conditions and failure policies that the chart installs.
func registerWebhooks(ctx context.Context, c *testbed.Cluster, docs []staticDoc, base string) error {
	var configs [][]byte
	for _, d := range docs {
		if d.kind != "MutatingWebhookConfiguration" && d.kind != "ValidatingWebhookConfiguration" {
			continue
		}
		// Both kinds share the fields changed here, so one untyped edit
		// serves them.
		var obj map[string]any
		if err := yaml.Unmarshal(d.raw, &obj); err != nil {
			return fmt.Errorf("decode %s from prism.yaml: %w", d.kind, err)
		}
		webhooks, _ := obj["webhooks"].([]any)
		for _, w := range webhooks {
			webhook, _ := w.(map[string]any)
			clientConfig, _ := webhook["clientConfig"].(map[string]any)
			service, _ := clientConfig["service"].(map[string]any)
			path, _ := service["path"].(string)
			if path == "" {
				return fmt.Errorf("webhook %v in prism.yaml has no Service path to map onto %s", webhook["name"], base)
			}
			webhook["clientConfig"] = map[string]any{"url": base + path}
		}
		if metadata, ok := obj["metadata"].(map[string]any); ok {
			delete(metadata, "annotations") // cert-manager's, when set
		}
		raw, err := yaml.Marshal(obj)
		if err != nil {
			return err
		}
		configs = append(configs, raw)
	}
	if len(configs) == 0 {
		return errors.New("the chart's rendering holds no webhook configuration")
	}
	if err := applyDocs(ctx, c, "prism-webhooks.yaml", configs); err != nil {
		return fmt.Errorf("register the chart's webhooks: %w", err)
	}
	return nil
}
