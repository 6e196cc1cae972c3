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
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// migClass is the chart's class of MIG partitions (rendered with the
// MIGPartitions gate), made here since the static manifests are rendered
// without it.
const migClass = rewrite.MIGDeviceClassName

// TestMIGPartitionsCreatedAtPrepare runs the MIGPartitions gate on a node
// with two A100-40GBs, the first in MIG mode: the real API server takes the
// partitions and their counters, the real scheduler gives two pods two
// 3g.20gb partitions of the first GPU and sends a plain claim to the second
// GPU, prepare creates a GPU and a compute instance for each partition at
// its placement (the simulated NVML records them) and unprepare destroys
// them.
func TestMIGPartitionsCreatedAtPrepare(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, testbed.Options{})
	if minor := serverMinor(t, cluster); minor < 36 {
		t.Skipf("DRAPartitionableDevices is off by default on Kubernetes 1.%d", minor)
	}
	node, err := cluster.AddNode(ctx, testbed.NodeOptions{Name: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	createPrismDeviceClass(ctx, t, cluster)
	if _, err := cluster.Client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: migClass},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
			Expression: `device.driver == "gpu.prism.dev" && has(device.attributes["gpu.prism.dev"].migProfile)`,
		}}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	record := filepath.Join(dir, "mig-record.jsonl")
	fleet := filepath.Join(dir, "mig-fleet.yaml")
	if err := os.WriteFile(fleet, []byte(`driverVersion: "550.54.15"
cudaDriverVersion: 12040
migRecordFile: `+record+`
gpus:
- product: NVIDIA A100-SXM4-40GB
  count: 1
  migMode: true
- product: NVIDIA A100-SXM4-40GB
  count: 1
`), 0o644); err != nil {
		t.Fatal(err)
	}
	startPluginWithFlags(ctx, t, cluster, node, fleet, []string{"--feature-gates=MIGPartitions=true"})

	var partitions []string
	waitFor(t, "the MIG partitions published", func() bool {
		partitions = nil
		list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName,
		})
		if err != nil {
			return false
		}
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				if _, ok := d.Attributes[gpuv1alpha1.MIGProfileAttribute.Qualified()]; ok {
					partitions = append(partitions, d.Name)
				}
			}
		}
		return len(partitions) > 0
	})
	// The A100-40GB's NVML placements: 7 + 4 + 3 + 2 + 1 + 1 + ... as the
	// plugin's unit tests pin them; here only that the API server took a
	// 7-way GPU's every partition in one slice.
	if len(partitions) < 19 {
		t.Errorf("published %d partitions of the A100 in MIG mode: %v", len(partitions), partitions)
	}

	createTemplate(ctx, t, cluster.Client, "mig-3g", resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: migClass, Count: 1, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.prism.dev"].migProfile == "3g.20gb"`}}}},
	}}}})
	createTemplate(ctx, t, cluster.Client, "whole", gpuClaimSpec(1))
	got := map[string]string{}
	for _, tc := range []struct{ pod, template string }{{"mig-a", "mig-3g"}, {"mig-b", "mig-3g"}, {"whole", "whole"}} {
		createPod(ctx, t, cluster.Client, podWithClaim(tc.pod, tc.template, ""))
		running, err := testbed.WaitForPod(ctx, cluster.Client, "default", tc.pod, time.Minute, testbed.PodRunning)
		if err != nil {
			t.Fatal(err)
		}
		got[tc.pod] = podClaim(ctx, t, cluster.Client, running).Status.Allocation.Devices.Results[0].Device
	}
	if a, b := got["mig-a"], got["mig-b"]; a == b || !strings.HasPrefix(a, "gpu-0-mig-3g") || !strings.HasPrefix(b, "gpu-0-mig-3g") {
		t.Errorf("the two 3g.20gb pods got %s and %s; want two 3g partitions of gpu-0", a, b)
	}
	if got["whole"] != "gpu-1" {
		t.Errorf("a plain claim got %s; want gpu-1, the GPU not in MIG mode, since gpu-0's partitions hold it", got["whole"])
	}
	if diff := cmp.Diff([]string{nvml.MIGCreateGPUInstance, nvml.MIGCreateComputeInstance, nvml.MIGCreateGPUInstance, nvml.MIGCreateComputeInstance}, migOps(t, record)); diff != "" {
		t.Errorf("NVML calls after two prepares (-want +got):\n%s", diff)
	}

	for _, pod := range []string{"mig-a", "mig-b", "whole"} {
		deletePod(ctx, t, cluster.Client, pod)
	}
	// The kubelet unprepares after the pod object is gone.
	waitFor(t, "both GPU instances destroyed", func() bool {
		destroyed := 0
		for _, op := range migOps(t, record) {
			if op == nvml.MIGDestroyGPUInstance {
				destroyed++
			}
		}
		return destroyed == 2
	})
}

// migOps lists the simulated NVML's MIG operations, in order.
func migOps(t *testing.T, record string) []string {
	t.Helper()
	records, err := nvml.ReadMIGRecords(record)
	if err != nil {
		t.Fatal(err)
	}
	var ops []string
	for _, r := range records {
		ops = append(ops, r.Op)
	}
	return ops
}
