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
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// migClass is the chart's class of MIG partitions, rendered with the
// MIGPartitions gate (bed.ApplyDeviceClasses).
const migClass = rewrite.MIGDeviceClassName

// TestMIGPartitionsCreatedAtPrepare runs the MIGPartitions gate on a node
// with two A100-40GBs, the first in MIG mode: the real API server takes the
// partitions and their counters, the real scheduler gives two pods two
// 3g.20gb partitions of the first GPU and sends a plain claim to the second
// GPU, prepare creates a GPU and a compute instance for each partition at
// its placement (the simulated NVML records them) and unprepare destroys
// them. Before Kubernetes 1.36 DRAPartitionableDevices is off by default and
// the API server drops the counters; the plugin must then fall back to whole
// GPUs and say so on the node.
func TestMIGPartitionsCreatedAtPrepare(t *testing.T) {
	m := newMIGNode(t)
	ctx, cluster, record := m.ctx, m.cluster, m.record
	if m.minor < 36 {
		checkWholeGPUFallback(ctx, t, cluster)
		return
	}

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
		deletePod(ctx, t, cluster, pod)
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

// migNode is a test-bed node with two A100-40GBs, the first in MIG mode,
// and its plugin running with the MIGPartitions gate; the simulated NVML
// appends every MIG operation to record.
type migNode struct {
	ctx     context.Context
	cluster *testbed.Cluster
	plugin  *pluginProc
	record  string
	minor   int
}

func newMIGNode(t *testing.T) *migNode {
	t.Helper()
	ctx, cluster, node := localNode(t)
	if _, err := bed.ApplyDeviceClasses(ctx, cluster, repoRoot, true); err != nil {
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
	p := startPluginWithFlags(ctx, t, cluster, node, fleet, []string{"--feature-gates=MIGPartitions=true"})
	return &migNode{ctx: ctx, cluster: cluster, plugin: p, record: record, minor: serverMinor(t, cluster)}
}

// TestMIGCrashLeavesNoOrphan kills the plugin with SIGKILL at each point of
// a MIG prepare between creating the instances and finishing the claim,
// restarts it, and checks that the instance the crash left is destroyed,
// that the kubelet's retry prepares the claim afresh, and that nothing is
// left once the pod is gone.
func TestMIGCrashLeavesNoOrphan(t *testing.T) {
	m := newMIGNode(t)
	if m.minor < 36 {
		t.Skipf("DRAPartitionableDevices is off by default on Kubernetes 1.%d: no partitions to prepare", m.minor)
	}
	createTemplate(m.ctx, t, m.cluster.Client, "mig-3g", resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: migClass, Count: 1, AllocationMode: resourceapi.DeviceAllocationModeExactCount,
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.prism.dev"].migProfile == "3g.20gb"`}}}},
	}}}})
	for i, point := range plugin.MIGCrashPoints {
		t.Run(point, func(t *testing.T) {
			_ = m.plugin.Stop(5 * time.Second)
			m.plugin.restart(m.ctx, t, "PRISM_CRASH_AT="+point)
			pod := fmt.Sprintf("mig-crash-%d", i)
			createPod(m.ctx, t, m.cluster.Client, podWithClaim(pod, "mig-3g", ""))
			select {
			case <-m.plugin.Done():
			case <-time.After(time.Minute):
				t.Fatalf("plugin did not reach crash point %s", point)
			}
			live := liveGPUInstances(t, m.record)
			if len(live) != 1 {
				t.Fatalf("GPU instances at the crash: %v, want the one prepare created", live)
			}
			orphan, atCrash := live[0], len(readMIGRecords(t, m.record))

			m.plugin.restart(m.ctx, t)
			nudgePod(m.ctx, t, m.cluster.Client, pod)
			if _, err := testbed.WaitForPod(m.ctx, m.cluster.Client, "default", pod, 2*time.Minute, testbed.PodRunning); err != nil {
				t.Fatal(err)
			}
			if live := liveGPUInstances(t, m.record); len(live) != 1 {
				t.Errorf("GPU instances with the pod running: %v, want one", live)
			}
			// The restart destroys the crash's instance; the retry may be
			// given the same id again.
			since := readMIGRecords(t, m.record)[atCrash:]
			if !slices.ContainsFunc(since, func(r nvml.MIGRecord) bool { return r.Op == nvml.MIGDestroyGPUInstance && instanceKey(r) == orphan }) {
				t.Errorf("the instance left by the crash, %s, was not destroyed after the restart: %+v", orphan, since)
			}

			deletePod(m.ctx, t, m.cluster, pod)
			waitFor(t, "no GPU instance left after the pod", func() bool { return len(liveGPUInstances(t, m.record)) == 0 })
		})
	}
}

// liveGPUInstances replays the simulated NVML's record: the GPU instances
// created and not destroyed.
func liveGPUInstances(t *testing.T, record string) []string {
	t.Helper()
	var live []string
	for _, r := range readMIGRecords(t, record) {
		switch r.Op {
		case nvml.MIGCreateGPUInstance:
			live = append(live, instanceKey(r))
		case nvml.MIGDestroyGPUInstance:
			live = slices.DeleteFunc(live, func(k string) bool { return k == instanceKey(r) })
		}
	}
	return live
}

func instanceKey(r nvml.MIGRecord) string { return fmt.Sprintf("%s/%d", r.UUID, r.GPUInstance) }

func readMIGRecords(t *testing.T, record string) []nvml.MIGRecord {
	t.Helper()
	records, err := nvml.ReadMIGRecords(record)
	if err != nil {
		t.Fatal(err)
	}
	return records
}

// migOps lists the simulated NVML's MIG operations, in order.
func migOps(t *testing.T, record string) []string {
	t.Helper()
	var ops []string
	for _, r := range readMIGRecords(t, record) {
		ops = append(ops, r.Op)
	}
	return ops
}

// checkWholeGPUFallback checks what a cluster without DRAPartitionableDevices
// gets from a plugin with the MIGPartitions gate: a PartitionableDevicesDropped
// Event on the node, a slice of whole GPUs only (partitions without their
// counters could be allocated twice over), and a plain claim that runs.
func checkWholeGPUFallback(ctx context.Context, t *testing.T, cluster *testbed.Cluster) {
	t.Helper()
	waitFor(t, "a PartitionableDevicesDropped event on the node", func() bool {
		evs, err := cluster.Client.CoreV1().Events("").List(ctx, metav1.ListOptions{
			FieldSelector: "reason=" + plugin.EventReasonPartitionableDevicesDropped + ",involvedObject.kind=Node",
		})
		return err == nil && len(evs.Items) > 0
	})
	var devices []string
	waitFor(t, "the slice republished with whole GPUs only", func() bool {
		list, err := cluster.Client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName,
		})
		if err != nil {
			return false
		}
		devices = nil
		for _, s := range list.Items {
			for _, d := range s.Spec.Devices {
				devices = append(devices, d.Name)
			}
		}
		sort.Strings(devices)
		return cmp.Equal(devices, []string{"gpu-0", "gpu-1"})
	})
	createTemplate(ctx, t, cluster.Client, "whole", gpuClaimSpec(1))
	createPod(ctx, t, cluster.Client, podWithClaim("whole", "whole", ""))
	if _, err := testbed.WaitForPod(ctx, cluster.Client, "default", "whole", time.Minute, testbed.PodRunning); err != nil {
		t.Fatalf("a plain claim on the fallback's whole GPUs: %v", err)
	}
}
