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
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/test/testbed"
)

// memoryShare is a claim for a slice of one GPU's memory and 30 % of its
// compute: a claim that names no compute takes all of it, and would hold
// the GPU alone.
func memoryShare(amount string) resourceapi.ResourceClaimSpec {
	spec := gpuClaimSpec(1)
	spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{
		Requests: map[resourceapi.QualifiedName]resource.Quantity{
			"gpu.prism.dev/memory":  resource.MustParse(amount),
			"gpu.prism.dev/compute": resource.MustParse("30"),
		},
	}
	return spec
}

// TestMemorySharesPackOneGPU: with consumable capacity, the real scheduler
// packs three 20Gi claims (30 % of compute each) onto one 80 GB GPU, sends
// a 30Gi claim that no longer fits there to another GPU, and each container
// is told its share.
func TestMemorySharesPackOneGPU(t *testing.T) {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	p := startPluginWithFlags(ctx, t, cluster, node, fleetPath("h100-sxm-8.yaml"), []string{"--consumable-capacity"})
	waitFor(t, "GPUs republished as shareable by memory", func() bool {
		s, err := nodeSlice(ctx, cluster.Client, node.Name)
		if err != nil || s == nil || len(s.Spec.Devices) != 8 {
			return false
		}
		d := s.Spec.Devices[0]
		return d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations && d.Capacity["gpu.prism.dev/memory"].RequestPolicy != nil &&
			d.Capacity["gpu.prism.dev/compute"].RequestPolicy != nil
	})

	createTemplate(ctx, t, cluster.Client, "share-20", memoryShare("20Gi"))
	createTemplate(ctx, t, cluster.Client, "share-30", memoryShare("30Gi"))
	devices := map[string]string{}
	for _, pod := range []string{"share-a", "share-b", "share-c", "share-d"} {
		template := "share-20"
		if pod == "share-d" {
			template = "share-30"
		}
		createPod(ctx, t, cluster.Client, podWithClaim(pod, template, ""))
		running, err := testbed.WaitForPod(ctx, cluster.Client, "default", pod, time.Minute, testbed.PodRunning)
		if err != nil {
			t.Fatal(err)
		}
		claim := podClaim(ctx, t, cluster.Client, running)
		r := claim.Status.Allocation.Devices.Results[0]
		if r.ShareID == nil {
			t.Errorf("%s: allocation has no share ID: %+v", pod, r)
		}
		devices[pod] = r.Device

		want := "20"
		if pod == "share-d" {
			want = "30"
		}
		oci := resolveWithCDICache(t, p.CDIRoot, node.Runtime.Created("default", pod)[0].CDIDevices)
		share := resource.MustParse(want + "Gi")
		wantEnv := plugin.EnvMemoryLimit + "=" + itoa(int(share.Value()))
		if !slices.Contains(oci.Process.Env, wantEnv) {
			t.Errorf("%s: container env lacks %s: %v", pod, wantEnv, oci.Process.Env)
		}
	}
	if devices["share-a"] != devices["share-b"] || devices["share-b"] != devices["share-c"] {
		t.Errorf("three 20Gi shares spread over %s, %s, %s; want one GPU", devices["share-a"], devices["share-b"], devices["share-c"])
	}
	if devices["share-d"] == devices["share-a"] {
		t.Errorf("the 30Gi share landed on %s next to 60Gi of shares on a GPU of 81559Mi", devices["share-d"])
	}
	var shared int
	for _, c := range readCheckpoint(t, p.StateDir) {
		if c.Devices[0].Name == devices["share-a"] {
			shared++
		}
	}
	if shared != 3 {
		t.Errorf("checkpoint holds %d claims on %s, want the 3 shares", shared, devices["share-a"])
	}
}
