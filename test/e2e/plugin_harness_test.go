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
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// repoRoot is where fleets and manifests are read from.
var repoRoot = func() string { d, _ := filepath.Abs("../.."); return d }()

// localNode starts a test-bed cluster with one node, localhost.
func localNode(t *testing.T) (context.Context, *testbed.Cluster, *testbed.Node) {
	t.Helper()
	ctx, cluster := testbed.ForTest(t, testbed.Options{})
	node, err := cluster.AddNode(ctx, testbed.NodeOptions{Name: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	return ctx, cluster, node
}

func fleetPath(name string) string { return filepath.Join(repoRoot, "demo", "fleets", name) }

// pluginProc is one prism-kubelet-plugin process serving a test-bed node.
type pluginProc struct {
	*testbed.Process
	node     *testbed.Node
	StateDir string
	CDIRoot  string
	HTTPAddr string
	args     []string
	env      []string
	cluster  *testbed.Cluster
}

// startPlugin runs prism-kubelet-plugin for node with a simulated fleet.
// extraEnv reaches the process (PRISM_CRASH_AT, for one).
func startPlugin(ctx context.Context, t *testing.T, c *testbed.Cluster, node *testbed.Node, fleet string, extraEnv ...string) *pluginProc {
	t.Helper()
	return startPluginWithFlags(ctx, t, c, node, fleet, nil, extraEnv...)
}

// startPluginWithFlags is startPlugin with extra command-line flags.
func startPluginWithFlags(ctx context.Context, t *testing.T, c *testbed.Cluster, node *testbed.Node, fleet string, flags []string, extraEnv ...string) *pluginProc {
	t.Helper()
	p := newPluginProc(ctx, t, c, node, fleet, flags, extraEnv...)
	p.restart(ctx, t)
	return p
}

// newPluginProc prepares a plugin process for node; restart starts it.
// Flags after the defaults win over them (--kubeconfig, say).
func newPluginProc(ctx context.Context, t *testing.T, c *testbed.Cluster, node *testbed.Node, fleet string, flags []string, extraEnv ...string) *pluginProc {
	t.Helper()
	port, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	p := &pluginProc{
		node:     node,
		cluster:  c,
		StateDir: filepath.Join(node.Dir, "prism-state"),
		CDIRoot:  filepath.Join(node.Dir, "cdi"),
		HTTPAddr: "127.0.0.1:" + strconv.Itoa(port),
		env:      extraEnv,
	}
	// The plugin runs with the chart's own ServiceAccount, RBAC and admission
	// policies, and a token bound to its node, so that a verb the chart
	// lacks fails here rather than on a user's cluster.
	if _, _, err := bed.InstallIdentities(ctx, c, repoRoot); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := bed.PluginKubeconfig(ctx, c, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	p.args = []string{
		"--node-name=" + node.Name,
		"--kubeconfig=" + kubeconfig,
		"--kubelet-registrar-dir=" + node.RegistrarDir(),
		"--kubelet-plugin-dir=" + node.PluginDir(gpuv1alpha1.DriverName),
		"--cdi-root=" + p.CDIRoot,
		"--state-dir=" + p.StateDir,
		"--fleet=" + fleet,
		"--http-address=" + p.HTTPAddr,
		"--rediscover-interval=1s",
		"--stale-claim-interval=1s",
		"--stale-claim-grace=3s",
		"-v=4",
	}
	p.args = append(p.args, flags...)
	t.Cleanup(func() {
		if p.Process != nil {
			_ = p.Stop(5 * time.Second)
		}
	})
	return p
}

// restart starts the process again with the same flags, and waits until it
// is ready; the previous one must have ended.
func (p *pluginProc) restart(ctx context.Context, t *testing.T, extraEnv ...string) {
	t.Helper()
	p.start(ctx, t, extraEnv...)
	// A process set to crash may die before it is ready; the caller waits
	// for that. It must still be registered before the caller creates a pod,
	// or the kubelet fails the pod's sync and retries only after 10-15 s.
	crashes := slices.ContainsFunc(append(slices.Clone(p.env), extraEnv...), func(e string) bool { return strings.HasPrefix(e, "PRISM_CRASH_AT=") })
	p.waitReadyOr(t, crashes)
}

// start starts the process with the same flags, without waiting for it.
func (p *pluginProc) start(ctx context.Context, t *testing.T, extraEnv ...string) {
	t.Helper()
	env := append(slices.Clone(p.env), extraEnv...)
	name, args := p.node.AgentCommand(pluginBinary, p.args...)
	proc, err := testbed.StartProcessWithEnv(ctx, "prism-plugin-"+p.node.Name, p.node.Dir,
		filepath.Join(p.cluster.WorkDir(), "logs", "prism-plugin-"+p.node.Name+".log"), env, name, args...)
	if err != nil {
		t.Fatal(err)
	}
	p.Process = proc
}

// waitReady waits for /readyz of the current process: registered with the
// kubelet, checkpoint reconciled, slice published.
func (p *pluginProc) waitReady(t *testing.T) { t.Helper(); p.waitReadyOr(t, false) }

// waitReadyOr is waitReady that, with exitOK, also ends when the process
// exits.
func (p *pluginProc) waitReadyOr(t *testing.T, exitOK bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 50*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		if exited, err := p.Exited(); exited {
			if exitOK {
				return true, nil
			}
			return false, fmt.Errorf("plugin exited: %v (log %s)", err, p.LogPath)
		}
		resp, err := http.Get("http://" + p.HTTPAddr + "/readyz")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("plugin on %s not ready: %v", p.node.Name, err)
	}
}

// waitForSlice waits for the node's ResourceSlice of the Prism driver with
// the given number of devices.
func waitForSlice(ctx context.Context, t *testing.T, client kubernetes.Interface, node string, devices int) *resourceapi.ResourceSlice {
	t.Helper()
	var found *resourceapi.ResourceSlice
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		s, err := nodeSlice(ctx, client, node)
		if err != nil || s == nil {
			return false, err
		}
		found = s
		return len(s.Spec.Devices) == devices, nil
	})
	if err != nil {
		got := -1
		if found != nil {
			got = len(found.Spec.Devices)
		}
		t.Fatalf("wait for ResourceSlice of node %s with %d devices (last had %d): %v", node, devices, got, err)
	}
	return found
}

func nodeSlice(ctx context.Context, client kubernetes.Interface, node string) (*resourceapi.ResourceSlice, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + node,
	})
	if err != nil {
		return nil, err
	}
	if len(list.Items) == 0 {
		return nil, nil
	}
	if len(list.Items) > 1 {
		return nil, fmt.Errorf("node %s has %d Prism slices, want 1", node, len(list.Items))
	}
	return &list.Items[0], nil
}

func createPrismDeviceClass(ctx context.Context, t *testing.T, c *testbed.Cluster) {
	t.Helper()
	out, err := runKubectl(c, "apply", "-f", filepath.Join(repoRoot, "deployments", "static", "deviceclasses.yaml"))
	if err != nil {
		t.Fatalf("apply DeviceClasses: %v\n%s", err, out)
	}
}

// gpuClaimSpec is a claim for count GPUs of class gpu.prism.dev with the
// given CEL selectors.
func gpuClaimSpec(count int64, selectors ...string) resourceapi.ResourceClaimSpec {
	req := resourceapi.ExactDeviceRequest{DeviceClassName: gpuv1alpha1.DriverName, Count: count, AllocationMode: resourceapi.DeviceAllocationModeExactCount}
	for _, s := range selectors {
		req.Selectors = append(req.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &req}}}}
}

// podWithClaim is a one-container pod using a claim from a template or an
// existing claim.
func podWithClaim(name string, template, claim string) *corev1.Pod {
	prc := corev1.PodResourceClaim{Name: "gpu"}
	if template != "" {
		prc.ResourceClaimTemplateName = ptr.To(template)
	} else {
		prc.ResourceClaimName = ptr.To(claim)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			ResourceClaims:                []corev1.PodResourceClaim{prc},
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
			}},
		},
	}
}

func createTemplate(ctx context.Context, t *testing.T, client kubernetes.Interface, name string, spec resourceapi.ResourceClaimSpec) {
	t.Helper()
	_, err := client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func createPod(ctx context.Context, t *testing.T, client kubernetes.Interface, pod *corev1.Pod) {
	t.Helper()
	if _, err := client.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// deletePod deletes the pod, waits until it is gone, then until the
// plugins have unprepared each of its claims that no other pod holds. The
// kubelet removes a terminated pod before it unprepares the pod's claims,
// so a pod created next could be allocated the same device, have its
// prepare refused while the old claim still holds it, and wait out the
// kubelet's 10-15 s retry.
func deletePod(ctx context.Context, t *testing.T, c *testbed.Cluster, name string) {
	t.Helper()
	kc := c.Client
	// Generated claims are named in the status, claims made by hand in the
	// spec.
	var names []*string
	if pod, err := kc.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{}); err == nil {
		for _, s := range pod.Status.ResourceClaimStatuses {
			names = append(names, s.ResourceClaimName)
		}
		for _, ref := range pod.Spec.ResourceClaims {
			names = append(names, ref.ResourceClaimName)
		}
	}
	var claims []*resourceapi.ResourceClaim
	for _, n := range names {
		if n == nil {
			continue
		}
		if claim, err := kc.ResourceV1().ResourceClaims("default").Get(ctx, *n, metav1.GetOptions{}); err == nil {
			claims = append(claims, claim)
		}
	}
	if err := kc.CoreV1().Pods("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := kc.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Fatalf("pod %s was not removed: %v", name, err)
	}
	for _, claim := range claims {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			if heldByOthers(ctx, kc, claim, name) {
				return true, nil
			}
			return len(claimSpecs(c, claim.UID)) == 0, nil
		})
		if err != nil {
			t.Fatalf("claim %s of the deleted pod %s is still prepared: %v", claim.Name, name, claimSpecs(c, claim.UID))
		}
	}
}

// nudgePod annotates the pod, which wakes its kubelet pod worker at once.
// After a failed prepare the kubelet retries only after its 10-15 s
// pod-sync backoff, and the crash tests check what the plugin does on the
// retry, not how long the kubelet waits for it.
func nudgePod(ctx context.Context, t *testing.T, client kubernetes.Interface, name string) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"e2e.prism.dev/nudge":"` + strconv.FormatInt(time.Now().UnixNano(), 10) + `"}}}`)
	if _, err := client.CoreV1().Pods("default").Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
}

// heldByOthers reports whether a pod other than the named one still has the
// claim reserved, so that it stays prepared.
func heldByOthers(ctx context.Context, client kubernetes.Interface, claim *resourceapi.ResourceClaim, pod string) bool {
	now, err := client.ResourceV1().ResourceClaims(claim.Namespace).Get(ctx, claim.Name, metav1.GetOptions{})
	if err != nil || now.UID != claim.UID {
		return false
	}
	return slices.ContainsFunc(now.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.Name != pod })
}

// claimSpecs lists the claim's CDI spec files on the cluster's nodes.
func claimSpecs(c *testbed.Cluster, uid types.UID) []string {
	var found []string
	for _, n := range c.Nodes() {
		spec := filepath.Join(n.Dir, "cdi", cdi.SpecFileName(string(uid)))
		if _, err := os.Stat(spec); err == nil {
			found = append(found, spec)
		}
	}
	return found
}

// podClaim returns the claim generated for the pod's single claim.
func podClaim(ctx context.Context, t *testing.T, client kubernetes.Interface, pod *corev1.Pod) *resourceapi.ResourceClaim {
	t.Helper()
	name := ""
	if pod.Spec.ResourceClaims[0].ResourceClaimName != nil {
		name = *pod.Spec.ResourceClaims[0].ResourceClaimName
	} else if len(pod.Status.ResourceClaimStatuses) == 1 && pod.Status.ResourceClaimStatuses[0].ResourceClaimName != nil {
		name = *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	}
	if name == "" {
		t.Fatalf("pod %s has no claim", pod.Name)
	}
	claim, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return claim
}

// claimPlan is the rewrite plan the controller annotated the claim with;
// zero where it has none.
func claimPlan(t *testing.T, claim *resourceapi.ResourceClaim) rewrite.Plan {
	t.Helper()
	var plan rewrite.Plan
	if raw, ok := claim.Annotations[rewrite.AnnotationKey]; ok {
		if err := json.Unmarshal([]byte(raw), &plan); err != nil {
			t.Fatalf("claim %s: plan %q: %v", claim.Name, raw, err)
		}
	}
	return plan
}

// allocatedDevice returns the attributes of the single device allocated to the claim.
func allocatedDevice(ctx context.Context, t *testing.T, client kubernetes.Interface, claim *resourceapi.ResourceClaim) resourceapi.Device {
	t.Helper()
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s: want one allocated device, got %+v", claim.Name, claim.Status.Allocation)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	// A pool of MIG partitions spans several slices.
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName + "," + resourceapi.ResourceSliceSelectorNodeName + "=" + r.Pool,
	})
	if err != nil {
		t.Fatalf("slices of pool %s: %v", r.Pool, err)
	}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			if d.Name == r.Device {
				return d
			}
		}
	}
	t.Fatalf("device %s not in pool %s", r.Device, r.Pool)
	return resourceapi.Device{}
}

func stringAttr(d resourceapi.Device, name string) string {
	a, ok := d.Attributes[resourceapi.QualifiedName("gpu.prism.dev/"+name)]
	if !ok || a.StringValue == nil {
		return ""
	}
	return *a.StringValue
}

func runKubectl(c *testbed.Cluster, args ...string) (string, error) {
	return testbed.Kubectl(context.Background(), c, args...)
}

// prismClient reads and writes Prism's own API types in the cluster.
func prismClient(t *testing.T, c *testbed.Cluster) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New(c.Config, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}
