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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
	"github.com/prismgpu/prism/test/testbed"
)

// An MPS tenant is a pod with a share of a GPU, in a namespace of its own
// and as a user of its own, whose container runs the stand-in MPS client
// (test/tools/fake-mps-control) against the daemon Prism started for its
// share: it must attach through the share's pipe directory, reach its
// server's shared memory through /dev/shm, and hold on to the server until
// the pod is deleted. The client exits if its server goes, and the pod
// (restartPolicy Never) then fails.
type mpsTenant struct {
	namespace string
	uid       int64
	compute   int64
	memory    string
	// capPercent, where not 0, is the cap on its SMs that its claim's
	// GpuConfig asks for; without one its share's SMs are not capped.
	capPercent int64
	// envEdit is how the workload tries to escape its limits: it unsets
	// or raises MPS's variables before it starts the client.
	envEdit string

	pod    *corev1.Pod
	claim  *resourceapi.ResourceClaim
	daemon *corev1.Pod
}

// mpsTenants are the two tenants of TestHelmInstallOnARealRuntime: one
// drops MPS's variables, the other, whose claim caps its SMs, raises them
// to the whole GPU.
func mpsTenants() []*mpsTenant {
	return []*mpsTenant{
		{namespace: "tenant-a", uid: 1000, compute: 30, memory: "10Gi", envEdit: "-u CUDA_MPS_ACTIVE_THREAD_PERCENTAGE -u CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"},
		{namespace: "tenant-b", uid: 2000, compute: 40, memory: "12Gi", capPercent: 40, envEdit: "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100 CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G"},
	}
}

// installStandInMPS puts the stand-in control binary where the chart's
// simulated plugin looks for the driver's, before it starts.
func installStandInMPS(t *testing.T, stateDir string) string {
	t.Helper()
	bin := buildStandIn(t, "fake-mps-control", mps.ControlBinary)
	dir := filepath.Join(stateDir, "fake-driver-root", "usr", "bin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(dir, mps.ControlBinary), mustReadFile(t, bin))
	if err := os.Chmod(filepath.Join(dir, mps.ControlBinary), 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// tenantScript reports what the container can reach, tries to remove its
// daemon's control pipe, then runs the client with its environment edited.
const tenantScript = `
echo "pipe $CUDA_MPS_PIPE_DIRECTORY"
if [ -e "$MPS_ROOT" ]; then echo "reach mps-root"; else echo "reach none"; fi
rm -f "$CUDA_MPS_PIPE_DIRECTORY/control" 2>/dev/null
if [ -S "$CUDA_MPS_PIPE_DIRECTORY/control" ]; then echo "control kept"; else echo "control removed"; fi
exec env $ENV_EDIT /opt/mps/nvidia-cuda-mps-control --cuda-client --hold=1h
`

// startMPSTenants creates each tenant's namespace, a template for its share
// of the GPU with uuid, and its pod, and waits until every client has
// attached.
func startMPSTenants(ctx context.Context, t *testing.T, client kubernetes.Interface, node *testbed.Node, stateDir, standIn, image, uuid string, tenants []*mpsTenant) {
	t.Helper()
	for _, tn := range tenants {
		if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: tn.namespace}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		spec := gpuClaimSpec(1, fmt.Sprintf("device.attributes[%q].%s == %q", gpuv1alpha1.DriverName, gpuv1alpha1.UUIDAttribute, uuid))
		spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
			gpuv1alpha1.MemoryCapacity.Qualified():  resource.MustParse(tn.memory),
			gpuv1alpha1.ComputeCapacity.Qualified(): *resource.NewQuantity(tn.compute, resource.DecimalSI),
		}}
		if tn.capPercent != 0 {
			spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver:     gpuv1alpha1.DriverName,
				Parameters: runtime.RawExtension{Raw: fmt.Appendf(nil, `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimitPercent":%d}}`, tn.capPercent)},
			}}}}
		}
		_, err := client.ResourceV1().ResourceClaimTemplates(tn.namespace).Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "share"},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: spec},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod := hostNetworkPod(podWithClaim("tenant", "share", ""))
		pod.Namespace = tn.namespace
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To(tn.uid), RunAsGroup: ptr.To(tn.uid)}
		pod.Spec.Volumes = []corev1.Volume{{Name: "mps", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: standIn}}}}
		c := &pod.Spec.Containers[0]
		c.Image, c.ImagePullPolicy = image, corev1.PullNever
		c.Command = []string{"/bin/sh", "-c", tenantScript}
		c.Env = []corev1.EnvVar{{Name: "MPS_ROOT", Value: filepath.Join(stateDir, "mps")}, {Name: "ENV_EDIT", Value: tn.envEdit},
			// The stand-in's record, which it would keep in the daemon's
			// log directory, out of the container's reach.
			{Name: "FAKE_MPS_CONTROL_RECORD", Value: "/tmp/mps-client.log"},
			// The documented rule, stricter than the H200's driver: the
			// client reaches its server only through the share's /dev/shm.
			{Name: "FAKE_MPS_SHM", Value: "shared"}}
		c.VolumeMounts = []corev1.VolumeMount{{Name: "mps", MountPath: "/opt/mps", ReadOnly: true}}
		createPod(ctx, t, client, pod)
	}
	for _, tn := range tenants {
		pod, err := testbed.WaitForPod(ctx, client, tn.namespace, "tenant", 2*time.Minute, testbed.PodRunning)
		if err != nil {
			t.Fatal(err)
		}
		tn.pod, tn.claim = pod, podClaim(ctx, t, client, pod)
		tn.waitAttached(t, node)
	}
}

// attached is what the tenant's client reported once attached, nil until
// then.
func (tn *mpsTenant) attached(t *testing.T, node *testbed.Node) (*mpstest.ClientResult, string) {
	t.Helper()
	log := podLog(t, node, tn.pod, "cuda")
	for _, line := range strings.Split(log, "\n") {
		if strings.HasPrefix(line, "{") {
			var res mpstest.ClientResult
			if err := json.Unmarshal([]byte(line), &res); err != nil {
				t.Fatalf("%s: client result %q: %v", tn.namespace, line, err)
			}
			return &res, log
		}
	}
	return nil, log
}

// waitAttached checks what the tenant's container could reach and that its
// client attached to a server of its own UID, with its share's limits
// whatever its environment said (every SM where its claim asks for no
// cap), without waiting for another.
func (tn *mpsTenant) waitAttached(t *testing.T, node *testbed.Node) {
	t.Helper()
	var res *mpstest.ClientResult
	var log string
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		res, log = tn.attached(t, node)
		return res != nil, nil
	})
	if err != nil {
		t.Fatalf("%s: the MPS client did not attach:\n%s", tn.namespace, log)
	}
	t.Logf("%s (UID %d, environment edited: %s):\n%s", tn.namespace, tn.uid, tn.envEdit, log)
	for _, want := range []string{"pipe " + mps.ContainerPipeDir, "reach none", "control kept"} {
		if !strings.Contains(log, want+"\n") {
			t.Errorf("%s: the container did not report %q", tn.namespace, want)
		}
	}
	uid := int(tn.uid)
	threads := float64(gpuv1alpha1.MaxComputePercent)
	if tn.capPercent != 0 {
		threads = float64(tn.capPercent)
	}
	want := mpstest.ClientResult{MPS: true, ServerUID: &uid, Server: res.Server,
		ActiveThreadPercentage: threads, PinnedMemLimitBytes: ptr.To(resource.MustParse(tn.memory)).Value()}
	if diff := cmp.Diff(want, *res); diff != "" {
		t.Errorf("%s: the client attached with (-want +got):\n%s", tn.namespace, diff)
	}
}

// daemonPods are the MPS daemon pods on the node, by the daemon they run.
func daemonPods(ctx context.Context, t *testing.T, client kubernetes.Interface) map[string]*corev1.Pod {
	t.Helper()
	list, err := client.CoreV1().Pods(bed.Namespace).List(ctx, metav1.ListOptions{LabelSelector: mps.ComponentLabel + "=" + mps.DaemonComponent})
	if err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		p := &list.Items[i]
		pods[p.Annotations[mps.DaemonAnnotation]] = p
	}
	return pods
}

// checkDaemonPods checks that each tenant's share has a daemon pod of its
// own, running, and notes it.
func checkDaemonPods(ctx context.Context, t *testing.T, client kubernetes.Interface, tenants []*mpsTenant) {
	t.Helper()
	pods := daemonPods(ctx, t, client)
	if len(pods) != len(tenants) {
		t.Errorf("%d MPS daemon pods, want one per tenant (%d)", len(pods), len(tenants))
	}
	for _, tn := range tenants {
		key := shareDaemonKey(tn.claim)
		p := pods[key]
		if p == nil || p.Status.Phase != corev1.PodRunning {
			t.Fatalf("%s: no running daemon pod for %s: %v", tn.namespace, key, p)
		}
		tn.daemon = p
	}
}

// checkTenantsServed checks, after what happened to the plugin, that each
// tenant's pod runs untouched and still holds its server (a client whose
// server went exits, and its pod fails), and that its daemon pod is the
// same and runs.
func checkTenantsServed(ctx context.Context, t *testing.T, client kubernetes.Interface, node *testbed.Node, tenants []*mpsTenant, after string) {
	t.Helper()
	for _, tn := range tenants {
		pod, err := client.CoreV1().Pods(tn.namespace).Get(ctx, "tenant", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if pod.UID != tn.pod.UID || pod.Status.Phase != corev1.PodRunning || pod.Status.ContainerStatuses[0].RestartCount != 0 {
			_, log := tn.attached(t, node)
			t.Errorf("after %s, %s's pod is %s; want it running untouched. Its log:\n%s", after, tn.namespace, podState(pod), log)
		}
		daemon, err := client.CoreV1().Pods(bed.Namespace).Get(ctx, tn.daemon.Name, metav1.GetOptions{})
		if err != nil || daemon.UID != tn.daemon.UID || daemon.Status.Phase != corev1.PodRunning {
			t.Errorf("after %s, %s's daemon pod %s: %v; want it running", after, tn.namespace, tn.daemon.Name, err)
		}
	}
}

// restartPluginContainer signals the plugin pod's container through
// containerd, as a crash (SIGKILL) or a stop (SIGTERM) would end it, and
// waits until the kubelet has restarted it and it is Ready again.
func restartPluginContainer(ctx context.Context, t *testing.T, client kubernetes.Interface, node *testbed.Node, pod *corev1.Pod, signal string) {
	t.Helper()
	pod, err := client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restarts := pod.Status.ContainerStatuses[0].RestartCount
	id := strings.TrimPrefix(pod.Status.ContainerStatuses[0].ContainerID, "containerd://")
	if out, err := node.Containerd.Ctr(ctx, "tasks", "kill", "--signal", signal, id); err != nil {
		t.Fatalf("%s the plugin's container: %v\n%s", signal, err, out)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err = client.CoreV1().Pods(pod.Namespace).Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && pod.Status.ContainerStatuses[0].RestartCount > restarts && podReady(pod), nil
	})
	if err != nil {
		t.Fatalf("the plugin's container was not restarted and Ready after %s: %s", signal, podState(pod))
	}
}

// adoptions counts the daemons a plugin pod's log says it adopted.
func adoptions(t *testing.T, node *testbed.Node, pod *corev1.Pod) int {
	t.Helper()
	return strings.Count(podLog(t, node, pod, "kubelet-plugin"), `"Adopted MPS control daemon"`)
}

// stopMPSTenants deletes the tenants' pods and checks that their daemon
// pods and directories go with their shares.
func stopMPSTenants(ctx context.Context, t *testing.T, client kubernetes.Interface, stateDir string, tenants []*mpsTenant) {
	t.Helper()
	for _, tn := range tenants {
		if err := client.CoreV1().Pods(tn.namespace).Delete(ctx, "tenant", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var left []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		left = nil
		for key := range daemonPods(ctx, t, client) {
			left = append(left, "pod of "+key)
		}
		entries, _ := os.ReadDir(filepath.Join(stateDir, "mps"))
		for _, e := range entries {
			left = append(left, "directory "+e.Name())
		}
		return len(left) == 0, nil
	})
	if err != nil {
		slices.Sort(left)
		t.Errorf("after the tenants' pods were deleted, left: %v", left)
	}
}

// claimUIDs are the claims' UIDs, sorted, as checkpointUIDs gives them.
func claimUIDs(claims ...types.UID) []string {
	var uids []string
	for _, c := range claims {
		uids = append(uids, string(c))
	}
	slices.Sort(uids)
	return uids
}

// checkPluginPodPolicy checks, with the plugin's own identity (its
// ServiceAccount, its token bound to a pod on node), that it may create and
// delete only MPS daemon pods of its own node: the chart's Role lets it
// write any pod in its namespace, and its ValidatingAdmissionPolicy
// narrows that.
func checkPluginPodPolicy(ctx context.Context, t *testing.T, c *testbed.Cluster, node *testbed.Node, other *corev1.Pod) {
	t.Helper()
	kubeconfig, err := bed.PluginKubeconfig(ctx, c, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	daemonPod := func(nodeName string, edit func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "forged-", Namespace: bed.Namespace, Labels: map[string]string{mps.ComponentLabel: mps.DaemonComponent}},
			Spec: corev1.PodSpec{NodeName: nodeName, AutomountServiceAccountToken: ptr.To(false),
				Containers: []corev1.Container{{Name: "c", Image: "forged"}}},
		}
		if edit != nil {
			edit(p)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"a daemon pod on another node", daemonPod("other-node", nil), "may only create and delete pods bound to that node"},
		{"a pod that is not a daemon's", daemonPod(node.Name, func(p *corev1.Pod) { p.Labels = nil }), "may only create and delete MPS daemon pods"},
		{"a daemon pod with a token", daemonPod(node.Name, func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = nil }), "gets no ServiceAccount token"},
	} {
		_, err := plugin.CoreV1().Pods(bed.Namespace).Create(ctx, tc.pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("the plugin's identity creating %s: %v, want a denial saying %q", tc.name, err, tc.want)
		}
	}
	err = plugin.CoreV1().Pods(other.Namespace).Delete(ctx, other.Name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	if err == nil || !strings.Contains(err.Error(), "may only create and delete MPS daemon pods") {
		t.Errorf("the plugin's identity deleting pod %s: %v, want a denial", other.Name, err)
	}
	if _, err := plugin.CoreV1().Pods(bed.Namespace).Create(ctx, daemonPod(node.Name, nil), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("the plugin's identity creating a daemon pod on its node: %v, want it allowed", err)
	}
}
