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
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/test/testbed"
)

// TestPodStatusShowsGPUHealth: with the ResourceHealthStatus gate on, the
// kubelet shows the health the plugin reports in the pod's status: the
// pod's GPU Healthy, then Unhealthy, naming the Xid, once the GPU raises a
// fatal one.
func TestPodStatusShowsGPUHealth(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, testbed.Options{FeatureGates: map[string]bool{"ResourceHealthStatus": true}})
	node, err := cluster.AddNode(ctx, testbed.NodeOptions{Name: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	createPrismDeviceClass(ctx, t, cluster)
	faults := filepath.Join(node.Dir, bed.FaultsFileName)
	// No recovery within the test: the GPU stays unhealthy once it is.
	startPluginWithFlags(ctx, t, cluster, node, fleetPath("t4-2.yaml"),
		[]string{"--simulated-faults=" + faults, "--health-recover-after=1h"})
	waitForSlice(ctx, t, cluster.Client, node.Name, 2)
	createTemplate(ctx, t, cluster.Client, "one-gpu", gpuClaimSpec(1))
	createPod(ctx, t, cluster.Client, podWithClaim("pod", "one-gpu", ""))
	pod, err := testbed.WaitForPod(ctx, cluster.Client, "default", "pod", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(ctx, t, cluster.Client, pod)
	device := claim.Status.Allocation.Devices.Results[0].Device
	// The kubelet names a device by the first CDI device ID its driver
	// prepared it with, and only without one by driver/pool/device.
	resourceID := corev1.ResourceID(cdi.DeviceID(string(claim.UID), device))

	waitForGPUHealth(ctx, t, cluster, "pod", map[corev1.ResourceID]string{resourceID: "Healthy"})

	index, err := strconv.Atoi(strings.TrimPrefix(device, "gpu-"))
	if err != nil {
		t.Fatalf("device name %q: %v", device, err)
	}
	if err := bed.AppendFault(faults, index, 48); err != nil {
		t.Fatal(err)
	}
	waitForGPUHealth(ctx, t, cluster, "pod", map[corev1.ResourceID]string{
		resourceID: "Unhealthy: Xid 48, a fatal GPU error; tainted gpu.prism.dev/unhealthy=xid-48:NoSchedule",
	})
}

// waitForGPUHealth waits until the pod's container status shows its claim's
// devices as want: "HEALTH" or "HEALTH: message" by resource ID.
func waitForGPUHealth(ctx context.Context, t *testing.T, cluster *testbed.Cluster, pod string, want map[corev1.ResourceID]string) {
	t.Helper()
	diff := "pod not read"
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := cluster.Client.CoreV1().Pods("default").Get(ctx, pod, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		got := map[corev1.ResourceID]string{}
		for _, cs := range p.Status.ContainerStatuses {
			for _, rs := range cs.AllocatedResourcesStatus {
				if rs.Name != "claim:gpu" {
					continue
				}
				for _, r := range rs.Resources {
					got[r.ResourceID] = string(r.Health)
					if r.Message != nil {
						got[r.ResourceID] += ": " + *r.Message
					}
				}
			}
		}
		diff = cmp.Diff(want, got)
		return diff == "", nil
	})
	if err != nil {
		t.Fatalf("pod %s's allocatedResourcesStatus for claim:gpu (-want +got):\n%s", pod, diff)
	}
}
