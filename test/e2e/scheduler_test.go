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
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
	"github.com/prismgpu/prism/test/testbed"
)

// The chart's prism-scheduler, as TestHelmInstallOnARealRuntime installs
// the rest of Prism: its image built by the image recipe and imported, the
// chart's KubeSchedulerConfiguration, RBAC and probes, on the host network
// with a kubeconfig Secret.
const (
	prismSchedulerName             = "prism-scheduler"
	schedulerKubeconfigSecret      = "prism-scheduler-kubeconfig"
	schedulerComponent             = "scheduler"
	schedulerLease                 = "prism-scheduler" // <fullname>-scheduler
	schedulerServiceAccount        = "prism-scheduler"
	stockSchedulerName             = corev1.DefaultSchedulerName
	schedulerVersion               = "v1.37.1-prism"
	schedulerScheduledEventTimeout = 2 * time.Minute
)

// TestPrismSchedulerFromTheChart installs the chart with scheduler.enabled
// on a containerd node and checks that prism-scheduler runs beside the test
// bed's stock kube-scheduler and schedules only what asks for it:
//  1. installed with no replica, a pod with schedulerName prism-scheduler
//     and a Prism claim stays unscheduled while the stock scheduler binds
//     and runs a pod that does not ask for it;
//  2. scaled to one replica, the scheduler pod (patched build) becomes
//     Ready on its secure port and holds and renews its own Lease;
//  3. it binds the waiting pod and allocates its claim, which the plugin
//     prepares: the container sees its GPU; the Scheduled event is
//     prism-scheduler's, and the stock scheduler never touched the pod.
func TestPrismSchedulerFromTheChart(t *testing.T) {
	testbed.RequireRoot(t)
	began := time.Now()
	stage := func(what string) { t.Logf("[%s] %s", time.Since(began).Round(time.Second), what) }
	images := buildPrismImages(context.Background(), t)
	scheduler := buildSchedulerImage(context.Background(), t)
	ctx, cluster := testbed.ForTest(t, testbed.Options{StandInImage: images.pause.Ref})
	dumpOnFailure(t, cluster)
	client := cluster.Client
	node, cdiRoot := containerdNode(ctx, t, cluster, "localhost", images.testImages, images.plugin.Path, images.controller.Path, scheduler.Path)
	stateDir := filepath.Join(node.Dir, "prism-state")
	if out, err := runKubectl(cluster, "label", "node", node.Name, "prism.dev/simulated-gpus=true"); err != nil {
		t.Fatalf("label node: %v\n%s", err, out)
	}
	stage("containerd node ready, images imported")

	// 1. Installed with no scheduler replica.
	securePort, err := testbed.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	helm := newHelm(t, cluster)
	chart := filepath.Join(repoRoot, "deployments", "helm", "prism")
	helm.run(ctx, t, "install", helmRelease, chart, "--namespace", bed.Namespace, "--create-namespace",
		"--values", filepath.Join(repoRoot, "deployments", "static", "values-demo.yaml"),
		"--set-file", "simulation.fleet="+fleetPath("mixed.yaml"),
		"--values", helmValues(t, node, cdiRoot, stateDir, filepath.Join(node.Dir, "dra"), images.tag),
		"--set", "scheduler.enabled=true",
		"--set", "scheduler.replicas=0",
		"--set", "scheduler.hostNetwork=true",
		"--set", "scheduler.kubeconfigSecret="+schedulerKubeconfigSecret,
		"--set", fmt.Sprintf("scheduler.securePort=%d", securePort))
	createKubeconfigSecrets(ctx, t, cluster, node.Name)
	createKubeconfigSecret(ctx, t, cluster, schedulerKubeconfigSecret, schedulerServiceAccount, "")
	componentPod(ctx, t, client, "kubelet-plugin", images.tag)
	waitForSlice(ctx, t, client, node.Name, 8)
	stage("helm install done, plugin publishes")

	createTemplate(ctx, t, client, "one-gpu", gpuClaimSpec(1))
	waiting := inventoryPod("by-prism-scheduler", "one-gpu", images.workload.Ref)
	waiting.Spec.SchedulerName = prismSchedulerName
	createPod(ctx, t, client, waiting)
	// The stock scheduler binds a pod that does not ask for prism-scheduler
	// meanwhile; the waiting pod is left alone.
	runInventoryPod(ctx, t, client, node, "by-stock-scheduler", "one-gpu", images.workload.Ref)
	if p, err := client.CoreV1().Pods("default").Get(ctx, waiting.Name, metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("with no prism-scheduler replica, pod %s: %v, node %q; want it unscheduled", waiting.Name, err, p.Spec.NodeName)
	}
	if _, err := client.CoordinationV1().Leases(bed.Namespace).Get(ctx, schedulerLease, metav1.GetOptions{}); err == nil {
		t.Fatalf("Lease %s exists with no scheduler replica", schedulerLease)
	}
	stage("stock scheduler ran by-stock-scheduler; by-prism-scheduler waits")

	// 2. One replica.
	helm.run(ctx, t, "upgrade", helmRelease, chart, "--namespace", bed.Namespace, "--reuse-values", "--set", "scheduler.replicas=1")
	schedPod := componentPod(ctx, t, client, schedulerComponent, images.tag)
	if !schedPod.Spec.HostNetwork {
		t.Errorf("scheduler pod %s is not on the host network", schedPod.Name)
	}
	hostname, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	checkLeaseRenewed(ctx, t, client, hostname)
	stage("scheduler pod " + schedPod.Name + " Ready, holds and renews Lease " + schedulerLease)

	// 3. It schedules the waiting pod; the plugin prepares its claim.
	pod, err := testbed.WaitForPod(ctx, client, "default", waiting.Name, 2*time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(ctx, t, client, pod)
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 || claim.Status.Allocation.Devices.Results[0].Driver != gpuv1alpha1.DriverName {
		t.Fatalf("claim %s allocation %+v, want one %s device", claim.Name, claim.Status.Allocation, gpuv1alpha1.DriverName)
	}
	if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].UID != pod.UID {
		t.Errorf("claim %s reserved for %+v, want pod %s", claim.Name, claim.Status.ReservedFor, pod.UID)
	}
	r := claim.Status.Allocation.Devices.Results[0]
	t.Logf("claim %s allocated %s/%s/%s", claim.Name, r.Driver, r.Pool, r.Device)
	inv := parseInventory(t, waitForLog(t, node, pod.Name, "inventory done"))
	checkInventory(ctx, t, client, inv, claim, filepath.Join(stateDir, "fake-driver-root"))
	stage("by-prism-scheduler runs with its GPU")

	// Who scheduled what: each pod's Scheduled event names its scheduler,
	// and the stock scheduler's log mentions only its own pod.
	for podName, want := range map[string]string{pod.Name: prismSchedulerName, "by-stock-scheduler": stockSchedulerName} {
		got := schedulingControllers(ctx, t, client, podName)
		t.Logf("pod %s: scheduling events from %v", podName, got)
		for _, c := range got {
			if c != want {
				t.Errorf("pod %s: scheduling events from %v, want them all from %s", podName, got, want)
				break
			}
		}
	}
	stockLog := mustReadFile(t, filepath.Join(cluster.WorkDir(), "logs", "kube-scheduler.log"))
	if !strings.Contains(string(stockLog), `pod="default/by-stock-scheduler"`) {
		t.Errorf("the stock scheduler's log does not mention default/by-stock-scheduler, which it bound")
	}
	if strings.Contains(string(stockLog), "default/"+pod.Name) {
		t.Errorf("the stock scheduler's log mentions default/%s, which it must leave to prism-scheduler", pod.Name)
	}
	// The patched build ran, not a stock kube-scheduler in its image.
	log := containerLog(t, cluster, bed.Namespace, schedPod.Name)
	if i := strings.Index(log, schedulerVersion); i < 0 {
		t.Errorf("prism-scheduler's log does not name its version %s:\n%s", schedulerVersion, firstLines(log, 20))
	} else {
		t.Logf("prism-scheduler's log: %s", firstLines(log[strings.LastIndex(log[:i], "\n")+1:], 1))
	}
	stage("events and logs agree: prism-scheduler bound by-prism-scheduler, the stock scheduler by-stock-scheduler")
}

// buildSchedulerImage builds the opt-in prism-scheduler image under the
// e2e's repository. Its binary comes from hack/upstream-allocator.sh's
// cache: the first run on a machine is a kube-scheduler build (minutes).
func buildSchedulerImage(ctx context.Context, t *testing.T) recipe.Result {
	t.Helper()
	res, _ := buildImages(ctx, t, "prism-scheduler")
	return res[0]
}

// createKubeconfigSecret stores a kubeconfig of the ServiceAccount (a
// TokenRequest token, bound to a stand-in pod on node unless node is empty;
// the API server on loopback) in a Secret of the release namespace, key
// kubeconfig, as the chart's kubeconfigSecret options read it.
func createKubeconfigSecret(ctx context.Context, t *testing.T, c *testbed.Cluster, secret, serviceAccount, node string) {
	t.Helper()
	path, err := c.ServiceAccountKubeconfig(ctx, bed.Namespace, serviceAccount, node)
	if err != nil {
		t.Fatal(err)
	}
	data := mustReadFile(t, path)
	_, err = c.Client.CoreV1().Secrets(bed.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret},
		Data:       map[string][]byte{"kubeconfig": data},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Secret %s: %v", secret, err)
	}
}

// checkLeaseRenewed waits for prism-scheduler's Lease to be held by a
// scheduler on this host (kube-scheduler's identity is <hostname>_<uuid>,
// and on the host network the pod's hostname is the node's) and renewed.
func checkLeaseRenewed(ctx context.Context, t *testing.T, client kubernetes.Interface, hostname string) {
	t.Helper()
	var first *metav1.MicroTime
	var holder string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		l, err := client.CoordinationV1().Leases(bed.Namespace).Get(ctx, schedulerLease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || l.Spec.RenewTime == nil {
			return false, nil
		}
		holder = *l.Spec.HolderIdentity
		if first == nil {
			first = l.Spec.RenewTime
			return false, nil
		}
		return l.Spec.RenewTime.After(first.Time), nil
	})
	if err != nil {
		t.Fatalf("Lease %s/%s not held and renewed (holder %q): %v", bed.Namespace, schedulerLease, holder, err)
	}
	t.Logf("Lease %s/%s held by %s, renewed after %s", bed.Namespace, schedulerLease, holder, first.Format(time.RFC3339Nano))
	if !strings.HasPrefix(holder, hostname+"_") {
		t.Errorf("Lease %s held by %q, want the scheduler on %s", schedulerLease, holder, hostname)
	}
	if _, err := client.CoordinationV1().Leases("kube-system").Get(ctx, "kube-scheduler", metav1.GetOptions{}); err == nil {
		t.Errorf("a kube-scheduler Lease exists in kube-system: the test bed's stock scheduler runs without leader election, so prism-scheduler took it")
	}
}

// schedulingControllers waits for the pod's Scheduled event and lists the
// reporting controllers of its Scheduled and FailedScheduling events.
func schedulingControllers(ctx context.Context, t *testing.T, client kubernetes.Interface, pod string) []string {
	t.Helper()
	var got []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, schedulerScheduledEventTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		got = nil
		scheduled := false
		for _, e := range list.Items {
			if e.Regarding.Kind != "Pod" || e.Regarding.Name != pod || (e.Reason != "Scheduled" && e.Reason != "FailedScheduling") {
				continue
			}
			got = append(got, eventSource(e))
			scheduled = scheduled || e.Reason == "Scheduled"
		}
		return scheduled, nil
	})
	if err != nil {
		t.Errorf("no Scheduled event for pod %s (events from %v): %v", pod, got, err)
	}
	return got
}

func eventSource(e eventsv1.Event) string {
	if e.ReportingController != "" {
		return e.ReportingController
	}
	return e.DeprecatedSource.Component
}

// containerLog is what the pod's containers logged, from the copies the
// test bed keeps under its logs directory.
func containerLog(t *testing.T, c *testbed.Cluster, namespace, pod string) string {
	t.Helper()
	return criLogs(t, filepath.Join(c.WorkDir(), "logs", "container-"+namespace+"_"+pod+"_*.log"))
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
