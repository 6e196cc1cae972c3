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
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/test/testbed"
)

// TestUnhealthyGPUIsTainted raises Xids on a simulated node through its NVML
// mock: an application Xid changes nothing, a fatal one taints the GPU so
// that new pods avoid it, and once the fault stops the taint goes away.
func TestUnhealthyGPUIsTainted(t *testing.T) {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	faults := filepath.Join(node.Dir, "faults.jsonl")
	p := startPluginWithFlags(ctx, t, cluster, node, fleetPath("t4-2.yaml"),
		[]string{"--simulated-faults=" + faults, "--health-recover-after=10s"})
	waitForSlice(ctx, t, cluster.Client, node.Name, 2)
	raise := func(gpu int, xid int) {
		f, err := os.OpenFile(faults, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := f.WriteString(`{"gpu":` + itoa(gpu) + `,"xid":` + itoa(xid) + "}\n"); err != nil {
			t.Fatal(err)
		}
	}
	taintsOf := func(name string) []resourceapi.DeviceTaint {
		s, err := nodeSlice(ctx, cluster.Client, node.Name)
		if err != nil || s == nil {
			return nil
		}
		for _, d := range s.Spec.Devices {
			if d.Name == name {
				return d.Taints
			}
		}
		return nil
	}

	raise(0, 13) // graphics engine exception: the application's fault
	waitFor(t, "application Xid counted as ignored", func() bool {
		return promValue(t, p.HTTPAddr, `prism_plugin_gpu_health_events_total{kind="ignored"}`) == 1
	})
	if ts := taintsOf("gpu-0"); len(ts) != 0 {
		t.Fatalf("an application Xid tainted gpu-0: %+v", ts)
	}

	raise(0, 48) // double-bit ECC error: the GPU's fault
	waitFor(t, "gpu-0 tainted NoSchedule", func() bool {
		ts := taintsOf("gpu-0")
		return len(ts) == 1 && ts[0].Key == plugin.TaintKey && ts[0].Value == "xid-48" && ts[0].Effect == resourceapi.DeviceTaintEffectNoSchedule
	})
	createTemplate(ctx, t, cluster.Client, "one-gpu", gpuClaimSpec(1))
	createPod(ctx, t, cluster.Client, podWithClaim("first", "one-gpu", ""))
	pod, err := testbed.WaitForPod(ctx, cluster.Client, "default", "first", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	if got := podClaim(ctx, t, cluster.Client, pod).Status.Allocation.Devices.Results[0].Device; got != "gpu-1" {
		t.Errorf("a new pod got %s, want the healthy gpu-1", got)
	}
	createPod(ctx, t, cluster.Client, podWithClaim("second", "one-gpu", ""))
	if _, err := testbed.WaitForPod(ctx, cluster.Client, "default", "second", 5*time.Second, testbed.PodRunning); err == nil {
		t.Fatal("a pod was given the tainted gpu-0")
	}

	// No new fatal event for the recovery period clears the taint.
	waitFor(t, "gpu-0 untainted", func() bool { return len(taintsOf("gpu-0")) == 0 })
	pod, err = testbed.WaitForPod(ctx, cluster.Client, "default", "second", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	if got := podClaim(ctx, t, cluster.Client, pod).Status.Allocation.Devices.Results[0].Device; got != "gpu-0" {
		t.Errorf("after recovery the waiting pod got %s, want gpu-0", got)
	}
	evs, err := cluster.Client.CoreV1().Events("default").List(ctx, metav1.ListOptions{FieldSelector: "reason=GPUUnhealthy"})
	if err != nil || len(evs.Items) == 0 || evs.Items[0].Type != corev1.EventTypeWarning {
		t.Errorf("no GPUUnhealthy warning event on the node: %v", err)
	}
}
