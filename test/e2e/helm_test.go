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

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"sigs.k8s.io/yaml"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// The Helm test installs Prism as a user does: its own images, built by
// `make images`' recipe (the plugin as a test build, for the simulated
// fleet) and imported into a containerd node (never pulled), then `helm
// install` of deployments/helm/prism with the demo's values and a simulated
// fleet. The plugin runs as the chart's DaemonSet pod and the
// controller as its Deployment's pod, both in real containers.

// helmRelease and the Secret names are what the test installs; the chart
// names its ServiceAccounts after the release (bed's constants).
const (
	helmRelease                = "prism"
	pluginKubeconfigSecret     = "prism-kubelet-plugin-kubeconfig"
	controllerKubeconfigSecret = "prism-controller-kubeconfig"
	// e2eRepository is where the test names Prism's images: a local name,
	// so that a pull, were one ever attempted, could only go to loopback.
	e2eRepository = "localhost/prism-e2e"
)

// prismImages are Prism's images and the test bed's, as OCI archives: the
// release's recipe, but the plugin is a test build, which runs the chart's
// simulation.fleet.
type prismImages struct {
	testImages
	plugin, controller recipe.Result
	tag                string
}

func buildPrismImages(ctx context.Context, t *testing.T) prismImages {
	t.Helper()
	o, err := recipe.DefaultOptions(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	o.Repository, o.Simulation = e2eRepository, true
	dir := t.TempDir()
	start := time.Now()
	res, err := recipe.Build(ctx, o, []string{"prism-kubelet-plugin", "prism-controller", "pause", "workload"}, func(name string) string { return filepath.Join(dir, name+".tar") })
	if err != nil {
		t.Fatalf("build the images: %v", err)
	}
	t.Logf("built Prism's images, the plugin with -tags %s, in %s", recipe.SimulationTags, time.Since(start).Round(time.Second))
	return prismImages{testImages: testImages{pause: res[2], workload: res[3]}, plugin: res[0], controller: res[1], tag: o.Tag}
}

// helmCLI runs the test bed's helm against the cluster, with its own
// configuration and cache directories.
type helmCLI struct {
	bin, kubeconfig string
	env             []string
}

func newHelm(t *testing.T, c *testbed.Cluster) helmCLI {
	home := t.TempDir()
	return helmCLI{bin: c.BinPath("helm"), kubeconfig: c.KubeconfigPath, env: append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(home, "cache"), "HELM_CONFIG_HOME="+filepath.Join(home, "config"), "HELM_DATA_HOME="+filepath.Join(home, "data"))}
}

func (h helmCLI) run(ctx context.Context, t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig", h.kubeconfig)...)
	cmd.Env = h.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("helm %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("helm %s:\n%s", args[0], out)
}

// templateToFile renders the repository's chart with helm template and
// writes the objects into a file named name, for kubectl to apply.
func templateToFile(ctx context.Context, t *testing.T, c *testbed.Cluster, name string, args ...string) string {
	t.Helper()
	cmd := exec.CommandContext(ctx, c.BinPath("helm"), append([]string{"template", "prism", filepath.Join(repoRoot, "deployments", "helm", "prism"), "--namespace", "prism-system"}, args...)...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	objects, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	file := writeTempFile(t, name, objects)
	return file
}

// helmValues are the chart values the test bed needs on top of the demo's:
// Prism's imported images, the node's host paths, and the chart's test and
// air-gap options (host network, kubeconfig Secrets, webhooks by URL on
// loopback), since pods here may only talk to loopback.
func helmValues(t *testing.T, node *testbed.Node, cdiRoot, stateDir, pluginDir, tag string) string {
	t.Helper()
	ports := make([]int, 3)
	for i := range ports {
		p, err := testbed.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = p
	}
	values := map[string]any{
		"image": map[string]any{"repository": e2eRepository, "tag": tag, "pullPolicy": "Never"},
		"kubeletPlugin": map[string]any{
			"hostNetwork":      true,
			"kubeconfigSecret": pluginKubeconfigSecret,
			"httpPort":         ports[0],
			// The kubelet's --root-dir and the directory containerd reads
			// CDI specs from are the node's own, not the defaults. The DRA
			// socket is named after the pod's UID (rolling updates), which
			// under the kubelet's root in the test bed's work directory
			// would pass the 108-byte limit of a Unix socket path; the
			// kubelet dials whatever endpoint the plugin registers, so a
			// shorter directory serves.
			"paths": map[string]any{
				"kubeletRegistrarDir": node.RegistrarDir(),
				"kubeletPluginDir":    pluginDir,
				"cdiRoot":             cdiRoot,
				"stateDir":            stateDir,
			},
		},
		"controller": map[string]any{
			"hostNetwork":      true,
			"kubeconfigSecret": controllerKubeconfigSecret,
			"httpPort":         ports[1],
		},
		"webhook": map[string]any{
			"port": ports[2],
			"url":  map[string]any{"enabled": true, "host": "127.0.0.1"},
		},
	}
	data, err := yaml.Marshal(values)
	if err != nil {
		t.Fatal(err)
	}
	path := writeTempFile(t, "values-testbed.yaml", data)
	t.Logf("test-bed values:\n%s", data)
	return path
}

// createKubeconfigSecrets gives Prism's pods their credentials. The test
// bed's API server runs without the ServiceAccount admission plugin, so pods
// get no ServiceAccount token mounted; instead each component gets a Secret
// with a kubeconfig that names the API server on loopback and carries a
// TokenRequest token of the chart's ServiceAccount. The plugin's token is
// bound to a stand-in pod on its node, so that it carries the node's name as
// a DaemonSet pod's own token would (the ResourceSlice policy and the
// profile-writes webhook check it). It is not bound to the plugin pod
// itself: a token dies with the pod it is bound to, and the Secret must
// outlive the pods a rolling update replaces. The ServiceAccounts exist
// only once the chart is installed; until the Secrets exist, the pods wait
// in ContainerCreating.
func createKubeconfigSecrets(ctx context.Context, t *testing.T, c *testbed.Cluster, node string) {
	t.Helper()
	for _, id := range []struct{ secret, serviceAccount, node string }{
		{pluginKubeconfigSecret, bed.PluginServiceAccount, node},
		{controllerKubeconfigSecret, bed.ControllerServiceAccount, ""},
	} {
		createKubeconfigSecret(ctx, t, c, id.secret, id.serviceAccount, id.node)
	}
}

// componentPod waits for the one pod of a chart component
// (kubelet-plugin, controller) that runs the image with the given tag to be
// Ready, with no other pod of the component left, and returns it.
func componentPod(ctx context.Context, t *testing.T, client kubernetes.Interface, component, tag string) *corev1.Pod {
	t.Helper()
	selector := "app.kubernetes.io/instance=" + helmRelease + ",app.kubernetes.io/component=" + component
	var found *corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		var states []string
		found = nil
		for i := range list.Items {
			p := &list.Items[i]
			states = append(states, podState(p))
			if p.DeletionTimestamp == nil && strings.HasSuffix(p.Spec.Containers[0].Image, ":"+tag) && podReady(p) {
				found = p
			}
		}
		last = strings.Join(states, "; ")
		return found != nil && len(list.Items) == 1, nil
	})
	if err != nil {
		t.Fatalf("wait for the %s pod on tag %s to be the only one and Ready (last: %s): %v", component, tag, last, err)
	}
	return found
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podState is a pod's phase and why its containers are not running.
func podState(p *corev1.Pod) string {
	s := fmt.Sprintf("%s %s ready=%v", p.Name, p.Status.Phase, podReady(p))
	if p.DeletionTimestamp != nil {
		s += " deleting"
	}
	for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
		if w := cs.State.Waiting; w != nil {
			s += fmt.Sprintf(", %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
		if term := cs.LastTerminationState.Terminated; term != nil {
			s += fmt.Sprintf(", %s last exited %d (%s)", cs.Name, term.ExitCode, term.Reason)
		}
	}
	return s
}

// dumpOnFailure prints, when the test fails, what an operator would look
// at first: the pods, events, and the container logs of Prism's pods, which
// the test bed keeps under its logs directory.
func dumpOnFailure(t *testing.T, c *testbed.Cluster) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, args := range [][]string{
			{"get", "nodes", "--show-labels"},
			{"get", "daemonsets,deployments,replicasets,pods", "-A", "-o", "wide"},
			{"describe", "pods", "-n", bed.Namespace},
			{"get", "events", "-A", "--sort-by=.lastTimestamp"},
		} {
			out, err := testbed.Kubectl(context.Background(), c, args...)
			t.Logf("---- kubectl %s (%v) ----\n%s", strings.Join(args, " "), err, out)
		}
		logs, _ := filepath.Glob(filepath.Join(c.WorkDir(), "logs", "container-"+bed.Namespace+"_*.log"))
		for _, f := range logs {
			data, err := os.ReadFile(f)
			if err != nil {
				continue
			}
			lines := strings.Split(strings.TrimSpace(criLogMessages(string(data))), "\n")
			if len(lines) > 80 {
				lines = lines[len(lines)-80:]
			}
			t.Logf("---- last lines of %s ----\n%s", f, strings.Join(lines, "\n"))
		}
	})
}

// webhookRewrites asks the API server to admit (dry run) a claim annotated
// with the profile, and returns the rewrite annotation the controller's
// mutating webhook added, empty when it added none.
func webhookRewrites(ctx context.Context, c *testbed.Cluster, profile string) string {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-" + profile, Namespace: "default", Annotations: map[string]string{"prism.dev/profile": profile}},
		Spec:       gpuClaimSpec(1),
	}
	out, err := c.Client.ResourceV1().ResourceClaims("default").Create(ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return ""
	}
	return out.Annotations[rewrite.AnnotationKey]
}

// sockets lists the Unix sockets under dir.
func sockets(t *testing.T, dir string) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSocket != 0 {
			found = append(found, path)
		}
		return nil
	})
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return found
}

// watchSliceGaps polls the node's Prism ResourceSlice until the returned
// function is called, which says for how long it was absent.
func watchSliceGaps(ctx context.Context, client kubernetes.Interface, node string) func() time.Duration {
	ctx, cancel := context.WithCancel(ctx)
	result := make(chan time.Duration, 1)
	go func() {
		var absent time.Duration
		const every = 250 * time.Millisecond
		for ctx.Err() == nil {
			if s, err := nodeSlice(ctx, client, node); err == nil && s == nil {
				absent += every
			}
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
		result <- absent
	}()
	return func() time.Duration { cancel(); return <-result }
}

// checkpointUIDs are the claims the node's checkpoint holds.
func checkpointUIDs(t *testing.T, stateDir string) []string {
	t.Helper()
	var uids []string
	for _, c := range readCheckpoint(t, stateDir) {
		uids = append(uids, string(c.UID))
	}
	slices.Sort(uids)
	return uids
}

// watchReadyOverlap follows the plugin's pods through a watch, event by
// event, until the returned function is called, which gives the first set of
// two or more pods that were Ready at once with none of them being deleted
// (nil if there never was one). A watch sees every state the API server
// stored, in order; polling could miss a short overlap.
func watchReadyOverlap(ctx context.Context, t *testing.T, client kubernetes.Interface) func() []string {
	t.Helper()
	selector := "app.kubernetes.io/instance=" + helmRelease + ",app.kubernetes.io/component=kubelet-plugin"
	list, err := client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	result := make(chan []string, 1)
	go func() {
		pods := map[string]*corev1.Pod{}
		for i := range list.Items {
			pods[list.Items[i].Name] = &list.Items[i]
		}
		var overlap []string
		rv := list.ResourceVersion
		for ctx.Err() == nil && overlap == nil {
			w, err := client.CoreV1().Pods(bed.Namespace).Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				p, ok := ev.Object.(*corev1.Pod)
				if !ok {
					continue
				}
				rv = p.ResourceVersion
				if ev.Type == "DELETED" {
					delete(pods, p.Name)
				} else {
					pods[p.Name] = p
				}
				var ready []string
				for _, p := range pods {
					if podReady(p) && p.DeletionTimestamp == nil {
						ready = append(ready, p.Name)
					}
				}
				if len(ready) >= 2 {
					slices.Sort(ready)
					overlap = ready
					break
				}
			}
			w.Stop()
		}
		result <- overlap
	}()
	return func() []string { cancel(); return <-result }
}

// kubeletLogLine is the index of the first line of the kubelet's log from
// line from on that holds every one of the strings, -1 when none does.
func kubeletLogLine(t *testing.T, c *testbed.Cluster, node string, from int, parts ...string) int {
	t.Helper()
	data := mustReadFile(t, filepath.Join(c.WorkDir(), "logs", "kubelet-"+node+".log"))
	for i, line := range strings.Split(string(data), "\n") {
		if i >= from && !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return i
		}
	}
	return -1
}

// kubeletLogLines is how many lines the kubelet's log has.
func kubeletLogLines(t *testing.T, c *testbed.Cluster, node string) int {
	t.Helper()
	return strings.Count(string(mustReadFile(t, filepath.Join(c.WorkDir(), "logs", "kubelet-"+node+".log"))), "\n")
}

// podLog is what a pod's container wrote, as the kubelet keeps it on the
// node.
func podLog(t *testing.T, node *testbed.Node, pod *corev1.Pod, container string) string {
	t.Helper()
	return criLogs(t, filepath.Join(node.Dir, "pod-logs", pod.Namespace+"_"+pod.Name+"_"+string(pod.UID), container, "*.log"))
}

// criLogs is the messages of the CRI log files that pattern matches.
func criLogs(t *testing.T, pattern string) string {
	t.Helper()
	files, _ := filepath.Glob(pattern)
	var b strings.Builder
	for _, f := range files {
		data := mustReadFile(t, f)
		b.WriteString(criLogMessages(string(data)))
	}
	return b.String()
}

// TestHelmInstallOnARealRuntime installs Prism with helm from its own images
// on a containerd node and uses it as a user would:
//  1. Prism's images are built with the image recipe and imported;
//  2. helm install with those images, a simulated fleet and the test-bed
//     values;
//  3. the plugin runs as the DaemonSet's pod, registers with the kubelet
//     through the chart's hostPath mounts and publishes its ResourceSlice;
//     the controller runs as the Deployment's pod and its webhooks, called
//     by URL, rewrite and validate;
//  4. a workload with a Prism claim sees its GPU in a real container, and
//     deleting it unprepares the claim;
//  5. helm upgrade to a second tag of the same images while a claim is
//     prepared, with surge although the pods are on the host network: the
//     new plugin pod registers next to the old one (both Ready, both
//     registration sockets, the kubelet registers the new before it
//     unregisters the old), the claim's checkpoint entry and CDI spec stay,
//     the new plugin binds the HTTP port once the old one has gone, and it
//     unprepares the claim the old one prepared;
//  6. helm uninstall leaves no CDI spec, checkpoint entry, plugin socket or
//     ResourceSlice on the node.
func TestHelmInstallOnARealRuntime(t *testing.T) {
	testbed.RequireRoot(t)
	began := time.Now()
	stage := func(what string) { t.Logf("[%s] %s", time.Since(began).Round(time.Second), what) }
	images := buildPrismImages(context.Background(), t)
	ctx, cluster := testbed.ForTest(t, testbed.Options{StandInImage: images.pause.Ref})
	dumpOnFailure(t, cluster)
	client := cluster.Client
	node, cdiRoot := containerdNode(ctx, t, cluster, "localhost", images.testImages, images.plugin.Path, images.controller.Path)
	stateDir := filepath.Join(node.Dir, "prism-state")
	pluginDir := filepath.Join(node.Dir, "dra")
	// As values-demo.yaml asks: simulated GPUs go on labelled nodes.
	if out, err := runKubectl(cluster, "label", "node", node.Name, "prism.dev/simulated-gpus=true"); err != nil {
		t.Fatalf("label node: %v\n%s", err, out)
	}
	standIn := installStandInMPS(t, stateDir)
	stage("containerd node ready, images imported, the stand-in MPS in the fake driver root")

	// 2. Install.
	helm := newHelm(t, cluster)
	chart := filepath.Join(repoRoot, "deployments", "helm", "prism")
	values := helmValues(t, node, cdiRoot, stateDir, pluginDir, images.tag)
	helm.run(ctx, t, "install", helmRelease, chart, "--namespace", bed.Namespace, "--create-namespace",
		"--values", filepath.Join(repoRoot, "deployments", "static", "values-demo.yaml"),
		"--set-file", "simulation.fleet="+fleetPath("mixed.yaml"),
		"--set", "sharing.consumableCapacity=true",
		"--values", values)
	createKubeconfigSecrets(ctx, t, cluster, node.Name)
	stage("helm install done, kubeconfig Secrets created")

	// 3. The plugin's pod registers and publishes; the controller's pod
	// serves the webhooks.
	pluginPod := componentPod(ctx, t, client, "kubelet-plugin", images.tag)
	if !pluginPod.Spec.HostNetwork || pluginPod.Spec.NodeName != node.Name {
		t.Fatalf("plugin pod %s: hostNetwork %v on node %q", pluginPod.Name, pluginPod.Spec.HostNetwork, pluginPod.Spec.NodeName)
	}
	waitForSlice(ctx, t, client, node.Name, 8)
	if socks := sockets(t, node.RegistrarDir()); len(socks) != 1 {
		t.Errorf("want the plugin's one registration socket in %s, found %v", node.RegistrarDir(), socks)
	}
	controllerPod := componentPod(ctx, t, client, "controller", images.tag)
	stage("plugin pod " + pluginPod.Name + " and controller pod " + controllerPod.Name + " ready, ResourceSlice published")

	// The webhooks are registered by URL on loopback and the controller put
	// its CA into them.
	mutating, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "prism-rewrite", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cc := mutating.Webhooks[0].ClientConfig; cc.URL == nil || !strings.HasPrefix(*cc.URL, "https://127.0.0.1:") || cc.Service != nil {
		t.Fatalf("prism-rewrite's client config %+v, want a URL on 127.0.0.1", cc)
	}
	prism := prismClient(t, cluster)
	profile := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: "stream", Namespace: "default"}}
	if err := prism.Create(ctx, profile); err != nil {
		t.Fatal(err)
	}
	profile.Status = prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeMemoryBound, SMThroughputMilliPercent: milli(20000), MemoryThroughputMilliPercent: milli(91000)}
	if err := prism.Status().Update(ctx, profile); err != nil {
		t.Fatal(err)
	}
	// Until the controller has injected its CA and read the profile and the
	// fleet, the Ignore failure policy admits claims unchanged.
	waitFor(t, "the rewrite webhook to annotate a claim for profile stream", func() bool {
		return strings.Contains(webhookRewrites(ctx, cluster, "stream"), "MemoryBound")
	})
	// The validating webhook denies a claim with a GpuConfig it cannot
	// decode; with failurePolicy Ignore only a webhook that answered can.
	bad := gpuClaimSpec(1)
	bad.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: gpuv1alpha1.DriverName, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","noSuchField":true}`)},
	}}}}
	_, err = client.ResourceV1().ResourceClaims("default").Create(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "bad-config"}, Spec: bad}, metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "validate.gpu.prism.dev") {
		t.Fatalf("claim with an undecodable GpuConfig: %v, want a denial by validate.gpu.prism.dev", err)
	}
	stage("webhooks answer: rewrite annotated, validation denied")

	// 4. A workload whose claim names the profile: the webhook rewrites the
	// claim, the scheduler allocates, the plugin in its container prepares,
	// containerd applies the CDI spec.
	_, err = client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "stream-gpu"},
		Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"prism.dev/profile": "stream"}},
			Spec:       gpuClaimSpec(1),
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, claim, inv := runInventoryPod(ctx, t, client, node, "inventory", "stream-gpu", images.workload.Ref)
	if plan := claimPlan(t, claim); plan.BoundType != "MemoryBound" {
		t.Errorf("workload's claim has rewrite plan %+v, want the MemoryBound plan", plan)
	}
	// Memory-bound, performance policy: the fleet's highest-bandwidth GPU.
	if got := stringAttr(allocatedDevice(ctx, t, client, claim), "productName"); got != "NVIDIA H100 80GB HBM3" {
		t.Errorf("memory-bound workload got a %s, want the mixed fleet's H100", got)
	}
	checkInventory(ctx, t, client, inv, claim, filepath.Join(stateDir, "fake-driver-root"))
	specsBefore := specFiles(t, cdiRoot)
	if len(specsBefore) != 1 {
		t.Fatalf("want one CDI spec for the workload's claim, found %v", specsBefore)
	}
	specBefore := mustReadFile(t, specsBefore[0])
	if got := checkpointUIDs(t, stateDir); !slices.Equal(got, []string{string(claim.UID)}) {
		t.Fatalf("checkpoint holds %v, want the workload's claim %s", got, claim.UID)
	}
	stage("workload sees its GPU in a real container")

	// Two tenants share the other H100 under MPS, each with a daemon pod
	// of its own, which outlives the plugin's container: a crash, a
	// restart, and (below) an upgrade.
	tenants := mpsTenants()
	var sharedUUID string
	for _, d := range waitForSlice(ctx, t, client, node.Name, 8).Spec.Devices {
		if d.Name != allocatedDevice(ctx, t, client, claim).Name && stringAttr(d, "productName") == "NVIDIA H100 80GB HBM3" {
			sharedUUID = stringAttr(d, string(gpuv1alpha1.UUIDAttribute))
		}
	}
	startMPSTenants(ctx, t, client, node, stateDir, standIn, images.workload.Ref, sharedUUID, tenants)
	checkDaemonPods(ctx, t, client, tenants)
	if tenants[0].claim.Status.Allocation.Devices.Results[0].Device != tenants[1].claim.Status.Allocation.Devices.Results[0].Device {
		t.Fatalf("the tenants' shares are on different GPUs")
	}
	checkPluginPodPolicy(ctx, t, cluster, node, controllerPod)
	allClaims := claimUIDs(claim.UID, tenants[0].claim.UID, tenants[1].claim.UID)
	allSpecs := specFiles(t, cdiRoot)
	stage("two tenants share an H100 under MPS, each with its own daemon pod and limits")
	for i, signal := range []string{"SIGKILL", "SIGTERM"} {
		restartPluginContainer(ctx, t, client, node, pluginPod, signal)
		checkTenantsServed(ctx, t, client, node, tenants, "the plugin's container got "+signal)
		if got, want := adoptions(t, node, pluginPod), 2*(i+1); got != want {
			t.Errorf("after the plugin's container got %s, its logs say it adopted %d MPS daemons, want %d", signal, got, want)
		}
		stage("the plugin's container restarted after " + signal + "; the tenants kept their servers")
	}

	// 5. Upgrade to a second tag of the same images while the claim is
	// prepared.
	upgradeTag := images.tag + "-retagged"
	for _, ref := range []string{images.plugin.Ref, images.controller.Ref} {
		newRef := strings.TrimSuffix(ref, ":"+images.tag) + ":" + upgradeTag
		if out, err := node.Containerd.Ctr(ctx, "images", "tag", ref, newRef); err != nil {
			t.Fatalf("retag %s: %v\n%s", ref, err, out)
		}
	}
	watch := watchSliceGaps(ctx, client, node.Name)
	readyOverlap := watchReadyOverlap(ctx, t, client)
	oldReg := filepath.Join(node.RegistrarDir(), kubeletplugin.RollingUpdateRegistrarSocketFile(node.RegistrarDir(), gpuv1alpha1.DriverName, pluginPod.UID))
	if socks := sockets(t, node.RegistrarDir()); !slices.Equal(socks, []string{oldReg}) {
		t.Fatalf("before the upgrade the registration sockets are %v, want the old plugin's %s", socks, oldReg)
	}
	upgradeStart := time.Now()
	// The restarts above unregistered the old plugin's socket too.
	upgradeLog := kubeletLogLines(t, cluster, node.Name)
	// The installed controller has written its path token; the upgrade
	// must keep it (the chart renders the paths the cluster has).
	tokenBefore := pathToken(ctx, t, client)
	helm.run(ctx, t, "upgrade", helmRelease, chart, "--namespace", bed.Namespace, "--reuse-values", "--set", "image.tag="+upgradeTag)
	// Until the old plugin's registration socket is gone: note the first
	// moment two plugins were registered, and what the node held then.
	var bothSockets, overlapCheckpoint, overlapSpecs []string
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, 3*time.Minute, true, func(context.Context) (bool, error) {
		socks := sockets(t, node.RegistrarDir())
		if bothSockets == nil && len(socks) == 2 && slices.Contains(socks, oldReg) {
			bothSockets = socks
			overlapCheckpoint, overlapSpecs = checkpointUIDs(t, stateDir), specFiles(t, cdiRoot)
		}
		return !slices.Contains(socks, oldReg), nil
	})
	if err != nil {
		t.Fatalf("the old plugin's registration socket %s is still there: %v", oldReg, err)
	}
	newPluginPod := componentPod(ctx, t, client, "kubelet-plugin", upgradeTag)
	pluginSwap := time.Since(upgradeStart)
	newControllerPod := componentPod(ctx, t, client, "controller", upgradeTag)
	if newPluginPod.UID == pluginPod.UID || newControllerPod.UID == controllerPod.UID {
		t.Fatalf("helm upgrade replaced no pod: plugin %s, controller %s", newPluginPod.Name, newControllerPod.Name)
	}
	// With surge the node always has a registered plugin, so its slice is
	// never withdrawn.
	absent := watch()
	t.Logf("upgrade: new plugin pod the only one and Ready %s after helm upgrade began; the node's ResourceSlice was absent for %s of that", pluginSwap.Round(100*time.Millisecond), absent.Round(100*time.Millisecond))
	if absent > 0 {
		t.Errorf("the node's ResourceSlice was absent for %s during a surge upgrade, want never", absent)
	}
	// The two-instance hand-off: both pods Ready at once (readiness is
	// registered and published), both registration sockets at once, and the
	// kubelet registered the new plugin before it unregistered the old one.
	newReg := filepath.Join(node.RegistrarDir(), kubeletplugin.RollingUpdateRegistrarSocketFile(node.RegistrarDir(), gpuv1alpha1.DriverName, newPluginPod.UID))
	ready := readyOverlap()
	registered := kubeletLogLine(t, cluster, node.Name, upgradeLog, "OperationExecutor.RegisterPlugin started", newReg)
	unregistered := kubeletLogLine(t, cluster, node.Name, upgradeLog, "OperationExecutor.UnregisterPlugin started", oldReg)
	t.Logf("hand-off: Ready at once %v; registration sockets at once %v; kubelet log: new registered at line %d, old unregistered at line %d", ready, bothSockets, registered, unregistered)
	want := []string{newReg, oldReg}
	slices.Sort(want)
	if !slices.Equal(bothSockets, want) {
		t.Errorf("registration sockets during the upgrade: %v at most, want both plugins' %v at once", bothSockets, want)
	}
	if !slices.Equal(ready, []string{pluginPod.Name, newPluginPod.Name}) && !slices.Equal(ready, []string{newPluginPod.Name, pluginPod.Name}) {
		t.Errorf("plugin pods Ready at once during the upgrade: %v, want the old %s and the new %s", ready, pluginPod.Name, newPluginPod.Name)
	}
	if registered < 0 || unregistered < 0 || registered > unregistered {
		t.Errorf("kubelet log: new plugin registered at line %d, old one unregistered at line %d; want both, the registration first", registered, unregistered)
	}
	// While both ran, the claim the old plugin prepared stayed prepared.
	if !slices.Equal(overlapCheckpoint, allClaims) || !slices.Equal(overlapSpecs, allSpecs) {
		t.Errorf("while both plugins were registered: checkpoint %v, CDI specs %v; want the claims %s and %v", overlapCheckpoint, overlapSpecs, allClaims, allSpecs)
	}
	httpAddress := ""
	for _, e := range newPluginPod.Spec.Containers[0].Env {
		if e.Name == "PRISM_HTTP_ADDRESS" {
			httpAddress = e.Value
		}
	}
	waitFor(t, "the new plugin to serve /metrics on "+httpAddress, func() bool {
		resp, err := http.Get("http://" + httpAddress + "/metrics")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	// The new plugin found the HTTP port held by the old one and took it
	// once the old one had exited. It retries on an interval, so the line
	// that says it bound the port can come after the hand-off checks above:
	// the log is read until it is there, or for 30s.
	var log string
	hasWaitedAndBound := func() bool {
		log = podLog(t, node, newPluginPod, "kubelet-plugin")
		return strings.Contains(log, "HTTP address in use") && strings.Contains(log, "Bound the HTTP address after it was freed")
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) { return hasWaitedAndBound(), nil }); err != nil {
		t.Errorf("the new plugin's log does not show it waiting for the HTTP port and binding it:\n%s", log)
	}
	unprepared := `prism_plugin_requests_total{method="unprepare",result="success"}`
	unpreparedBefore := promValue(t, httpAddress, unprepared)
	stage("helm upgrade done: plugin pod " + newPluginPod.Name + ", controller pod " + newControllerPod.Name)
	if tokenAfter := checkOnlyTheAPIServerIsReviewed(ctx, t, client); tokenAfter != tokenBefore {
		t.Errorf("the upgrade changed the path token from %s to %s: the chart reset the webhooks' paths", tokenBefore, tokenAfter)
	}
	stage("the upgraded controller kept the path token and reviews only requests that name it")
	running, err := client.CoreV1().Pods("default").Get(ctx, "inventory", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if running.UID != pod.UID || running.Status.Phase != corev1.PodRunning || running.Status.ContainerStatuses[0].RestartCount != 0 {
		t.Errorf("workload across the upgrade: %s, restarts %d; want the same pod running untouched", podState(running), running.Status.ContainerStatuses[0].RestartCount)
	}
	if got := checkpointUIDs(t, stateDir); !slices.Equal(got, allClaims) {
		t.Errorf("after the upgrade the checkpoint holds %v, want the claims %s", got, allClaims)
	}
	if specs := specFiles(t, cdiRoot); !slices.Equal(specs, allSpecs) {
		t.Errorf("after the upgrade the CDI specs are %v, want %v", specs, allSpecs)
	} else if after, err := os.ReadFile(specsBefore[0]); err != nil || string(after) != string(specBefore) {
		t.Errorf("the workload's CDI spec changed across the upgrade (%v)", err)
	}
	// The new controller made a CA of its own; reviews still pass TLS.
	waitFor(t, "the upgraded controller's rewrite webhook", func() bool {
		return strings.Contains(webhookRewrites(ctx, cluster, "stream"), "MemoryBound")
	})
	// The new plugin registered: it prepares a second workload.
	createTemplate(ctx, t, client, "one-gpu", gpuClaimSpec(1))
	_, claim2, inv2 := runInventoryPod(ctx, t, client, node, "after-upgrade", "one-gpu", images.workload.Ref)
	checkInventory(ctx, t, client, inv2, claim2, filepath.Join(stateDir, "fake-driver-root"))
	stage("upgraded plugin prepared a second workload")
	checkTenantsServed(ctx, t, client, node, tenants, "helm upgrade")
	if got := adoptions(t, node, newPluginPod); got != len(tenants) {
		t.Errorf("the upgraded plugin's log says it adopted %d MPS daemons, want %d", got, len(tenants))
	}
	stopMPSTenants(ctx, t, client, stateDir, tenants)
	waitFor(t, "the new plugin to count the tenants' unprepares", func() bool {
		return promValue(t, httpAddress, unprepared) == unpreparedBefore+float64(len(tenants))
	})
	unpreparedBefore += float64(len(tenants))
	stage("the tenants kept their servers across the upgrade; deleted, their daemon pods and directories went")

	// The new plugin, alone on the node since the old one's socket went,
	// unprepares the claim the old one prepared, then its own.
	deletePod(ctx, t, cluster, "inventory")
	waitFor(t, "the first workload's CDI spec removed", func() bool { return !slices.Contains(specFiles(t, cdiRoot), specsBefore[0]) })
	// The spec goes inside the unprepare call; the counter rises when the
	// call returns, a moment later.
	waitFor(t, "the new plugin to count the first workload's unprepare", func() bool { return promValue(t, httpAddress, unprepared) > unpreparedBefore })
	if got := promValue(t, httpAddress, unprepared); got != unpreparedBefore+1 {
		t.Errorf("the new plugin counts %v successful unprepares after the first workload ended, want %v", got, unpreparedBefore+1)
	}
	deletePod(ctx, t, cluster, "after-upgrade")
	waitFor(t, "every CDI spec removed", func() bool { return len(specFiles(t, cdiRoot)) == 0 })
	// The spec goes first inside the unprepare call, the checkpoint entry
	// last, a moment later.
	waitFor(t, "the checkpoint to hold no claim after both workloads ended", func() bool { return len(checkpointUIDs(t, stateDir)) == 0 })
	stage("both workloads deleted and unprepared")

	// 6. Uninstall.
	helm.run(ctx, t, "uninstall", helmRelease, "--namespace", bed.Namespace, "--wait")
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/instance=" + helmRelease})
		return err == nil && len(list.Items) == 0, nil
	})
	if err != nil {
		t.Fatalf("Prism's pods still exist after helm uninstall: %v", err)
	}
	stage("helm uninstall done, Prism's pods gone")
	if specs := specFiles(t, cdiRoot); len(specs) != 0 {
		t.Errorf("CDI specs left after uninstall: %v", specs)
	}
	if got := checkpointUIDs(t, stateDir); len(got) != 0 {
		t.Errorf("checkpoint entries left after uninstall: %v", got)
	}
	for _, dir := range []string{node.RegistrarDir(), pluginDir} {
		if socks := sockets(t, dir); len(socks) != 0 {
			t.Errorf("plugin sockets left after uninstall: %v", socks)
		}
	}
	// The kubelet removes an unregistered driver's ResourceSlices once the
	// plugin has stayed away for a while.
	err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := nodeSlice(ctx, client, node.Name)
		return err == nil && s == nil, nil
	})
	if err != nil {
		t.Errorf("the node's Prism ResourceSlice is still published after uninstall: %v", err)
	}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "prism-rewrite", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("prism-rewrite after uninstall: %v, want it gone", err)
	}
	left, _ := os.ReadDir(stateDir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	t.Logf("left in the state directory %s for the operator (chart README, Uninstall): %v", stateDir, names)
	stage("node clean")
}

// checkOnlyTheAPIServerIsReviewed checks the default chart's answer to a
// caller that is not the API server: the webhook configurations carry the
// controller's path token, the API server's reviews (which name it) are
// answered, and a review that names no token, or another, gets a 404, even
// one sent over TLS without a client certificate straight to the port.
func checkOnlyTheAPIServerIsReviewed(ctx context.Context, t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	token := pathToken(ctx, t, client)
	base := strings.TrimSuffix(rewriteURL(ctx, t, client), "/"+token)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}} //nolint:gosec // a forger checks nothing
	post := func(url string) int {
		review := `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"resource":{"group":"resource.k8s.io","version":"v1","resource":"resourceclaims"},"operation":"CREATE","namespace":"default","object":{"metadata":{"name":"forged","annotations":{"prism.dev/profile":"stream"}},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{"memory":"1e-9999999"}}}}]}}}}}`
		resp, err := hc.Post(url, "application/json", strings.NewReader(review))
		if err != nil {
			t.Fatalf("posting a review to %s: %v", url, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	other := strings.Repeat("0", len(token))
	if other == token {
		other = strings.Repeat("1", len(token))
	}
	// The plain paths are served for a short grace after the controller
	// wrote a token where there was none; a controller that finds the
	// token (as after an upgrade) adopts it at once.
	waitFor(t, "the plain path to be refused", func() bool { return post(base) == http.StatusNotFound })
	if code := post(base + "/" + other); code != http.StatusNotFound {
		t.Errorf("a review naming another token: %d, want 404", code)
	}
	// With the token the costly quantity is refused without decoding it;
	// the mutating webhook admits such a claim unchanged.
	if code := post(base + "/" + token); code != http.StatusOK {
		t.Errorf("a review naming the token: %d, want 200", code)
	}
	return token
}

// pathToken waits for the rewrite webhook's URL to carry the controller's
// path token and returns it.
func pathToken(ctx context.Context, t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	var token string
	waitFor(t, "the rewrite webhook's URL to carry the path token", func() bool {
		_, token = webhook.SplitPathToken(rewriteURL(ctx, t, client))
		return token != ""
	})
	return token
}

func rewriteURL(ctx context.Context, t *testing.T, client kubernetes.Interface) string {
	t.Helper()
	m, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "prism-rewrite", metav1.GetOptions{})
	if err != nil || m.Webhooks[0].ClientConfig.URL == nil {
		return ""
	}
	return *m.Webhooks[0].ClientConfig.URL
}
