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
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/internal/goldentest"
	"github.com/prismgpu/prism/test/testbed"
)

// TestPublishedSlice covers what users read and select on: the exact slice a
// simulated mixed node publishes, kubectl's view of it, a CEL selector on
// bandwidth that must land on an H100, and a request nothing satisfies.
func TestPublishedSlice(t *testing.T) {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	startPlugin(ctx, t, cluster, node, fleetPath("mixed.yaml"))
	slice := waitForSlice(ctx, t, cluster.Client, node.Name, 8)

	t.Run("slice matches golden", func(t *testing.T) {
		if slice.Spec.Driver != "gpu.prism.dev" || slice.Spec.Pool.Name != node.Name || *slice.Spec.NodeName != node.Name {
			t.Fatalf("slice driver/pool/node = %s/%s/%s", slice.Spec.Driver, slice.Spec.Pool.Name, *slice.Spec.NodeName)
		}
		got, err := yaml.Marshal(slice.Spec.Devices)
		if err != nil {
			t.Fatal(err)
		}
		goldentest.Compare(t, filepath.Join("testdata", "mixed-node-devices.golden.yaml"), got)
	})

	t.Run("kubectl describe shows the attributes", func(t *testing.T) {
		out, err := runKubectl(cluster, "describe", "resourceslices")
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		for _, want := range []string{
			"gpu.prism.dev/memoryBandwidthGBps:", "Int:  3352", "gpu.prism.dev/bandwidthClass:", "String:  ultra",
			"gpu.prism.dev/fp32GFLOPS:", "gpu.prism.dev/nvlinkDomain:", "String:  NVIDIA H100 80GB HBM3", "String:  Tesla T4",
			"resource.kubernetes.io/pciBusID:", "gpu.prism.dev/memory:", "Value:  81559Mi",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("kubectl describe resourceslices lacks %q", want)
			}
		}
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})

	t.Run("bandwidth selector gets an H100", func(t *testing.T) {
		createTemplate(ctx, t, cluster.Client, "fast-memory", gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].memoryBandwidthGBps >= 3000`))
		createPod(ctx, t, cluster.Client, podWithClaim("fast-memory", "fast-memory", ""))
		pod, err := testbed.WaitForPod(ctx, cluster.Client, "default", "fast-memory", time.Minute, testbed.PodRunning)
		if err != nil {
			t.Fatal(err)
		}
		dev := allocatedDevice(ctx, t, cluster.Client, podClaim(ctx, t, cluster.Client, pod))
		if got := stringAttr(dev, "productName"); got != "NVIDIA H100 80GB HBM3" {
			t.Errorf("allocated %s (%s), want an H100", dev.Name, got)
		}
	})

	t.Run("unsatisfiable request stays Pending with the scheduler's reason", func(t *testing.T) {
		createTemplate(ctx, t, cluster.Client, "impossible", gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].memoryBandwidthGBps >= 100000`))
		createPod(ctx, t, cluster.Client, podWithClaim("impossible", "impossible", ""))
		pod, err := testbed.WaitForPod(ctx, cluster.Client, "default", "impossible", time.Minute, func(p *corev1.Pod) (bool, error) {
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
					return true, nil
				}
			}
			return false, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if pod.Status.Phase != corev1.PodPending {
			t.Errorf("phase %s, want Pending", pod.Status.Phase)
		}
		var msg string
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.PodScheduled {
				msg = c.Message
			}
		}
		if !strings.Contains(msg, "cannot allocate all claims") {
			t.Errorf("scheduler message %q does not explain the claim", msg)
		}
	})

	t.Run("republishes when the devices change", func(t *testing.T) {
		// The plugin rereads its fleet file; a node that loses GPUs must stop
		// offering them.
		data := mustReadFile(t, fleetPath("t4-2.yaml"))
		path := filepath.Join(node.Dir, "changing-fleet.yaml")
		writeFile(t, path, data)
		// A second node keeps this subtest independent of the first plugin.
		other, err := cluster.AddNode(ctx, testbed.NodeOptions{Name: "changing"})
		if err != nil {
			t.Fatal(err)
		}
		startPlugin(ctx, t, cluster, other, path)
		waitForSlice(ctx, t, cluster.Client, other.Name, 2)
		writeFile(t, path, []byte(strings.Replace(string(data), "count: 2", "count: 1", 1)))
		waitForSlice(ctx, t, cluster.Client, other.Name, 1)
	})
}
