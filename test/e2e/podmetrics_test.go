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
	"bytes"
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/test/testbed"
)

// TestPodGPUMetricsCarryThePodsLabels: the plugin exports what NVML shows
// on the GPU a pod's claim holds, labelled with the pod's namespace, name,
// claim and the GPU's UUID, and only for that GPU; the series go with the
// pod. Every GPU of the node shows different figures, so a series put on
// the wrong GPU, or a GPU's figures put on the wrong pod, shows in the
// values.
func TestPodGPUMetricsCarryThePodsLabels(t *testing.T) {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	usageFile := filepath.Join(node.Dir, "gpu-usage.json")
	fleet := fleetWithUsageFile(t, node.Dir, "h100-sxm-8.yaml", usageFile)
	figures := func(i int) nvml.GPUUsage {
		return nvml.GPUUsage{Index: i, UtilizationPercent: uint32(30 + i), MemoryUsedBytes: uint64(int64(i+1) * gi),
			SMActivityPercent: float64(20 + i), DRAMActivityPercent: float64(5 + i)}
	}
	writeUsage(t, usageFile, figures)
	p := startPluginWithFlags(ctx, t, cluster, node, fleet, []string{"--usage-interval=1s"})
	waitForSlice(ctx, t, cluster.Client, node.Name, 8)

	client := cluster.Client
	createTemplate(ctx, t, client, "one-gpu", gpuClaimSpec(1))
	createPod(ctx, t, client, podWithClaim("metered", "one-gpu", ""))
	pod, err := testbed.WaitForPod(ctx, client, "default", "metered", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(ctx, t, client, pod)
	device := allocatedDevice(ctx, t, client, claim)
	uuid := stringAttr(device, string(gpuv1alpha1.UUIDAttribute))
	index := int(*device.Attributes[gpuv1alpha1.IndexAttribute.Qualified()].IntValue)
	shown := figures(index)

	labels := fmt.Sprintf(`{claim=%q,gpu=%q,namespace="default",pod="metered"}`, claim.Name, uuid)
	want := map[string]float64{
		"prism_plugin_gpu_duty_cycle_percent" + labels: float64(shown.UtilizationPercent),
		"prism_plugin_gpu_memory_used_bytes" + labels:  float64(shown.MemoryUsedBytes),
		// The simulated H100 has GPM, whose first figure needs two samples.
		"prism_plugin_gpu_sm_activity_percent" + labels:   shown.SMActivityPercent,
		"prism_plugin_gpu_dram_activity_percent" + labels: shown.DRAMActivityPercent,
	}
	waitForPodSeries(t, p.HTTPAddr, "the pod's GPU series", want)

	deletePod(ctx, t, cluster, "metered")
	waitForPodSeries(t, p.HTTPAddr, "the pod's GPU series gone after unprepare", map[string]float64{})
}

// fleetWithUsageFile writes a copy of a demo fleet into dir that reads its
// GPUs' usage from usageFile, and returns its path.
func fleetWithUsageFile(t *testing.T, dir, demoFleet, usageFile string) string {
	t.Helper()
	data := mustReadFile(t, fleetPath(demoFleet))
	data = append(bytes.TrimRight(data, "\n"), []byte("\nusageFile: "+usageFile+"\n")...)
	path := filepath.Join(dir, "usage-"+demoFleet)
	writeFile(t, path, data)
	return path
}

// waitForPodSeries waits until the plugin's per-pod GPU series are want,
// and shows the difference if they never are.
func waitForPodSeries(t *testing.T, addr, what string, want map[string]float64) {
	t.Helper()
	var got map[string]float64
	err := wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = podSeries(t, addr)
		return cmp.Equal(want, got), nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s (-want +got):\n%s", what, cmp.Diff(want, got))
	}
}

// podSeriesLine is a sample of the text format with labels; client_golang
// writes the labels sorted by name.
var podSeriesLine = regexp.MustCompile(`^(prism_plugin_gpu_[a-z_]+\{[^}]*\}) (\S+)$`)

// podSeries reads the plugin's series that carry a pod label, by
// name{labels}.
func podSeries(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, line := range scrapeMetrics(t, addr) {
		m := podSeriesLine.FindStringSubmatch(line)
		if m == nil || !strings.Contains(m[1], `pod="`) {
			continue
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("parse %q: %v", line, err)
		}
		out[m[1]] = v
	}
	return out
}
