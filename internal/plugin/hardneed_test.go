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

package plugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// TestPrepareRefusesAGPUBelowAHardNeed: a scheduler without
// DRAConsumableCapacity may ignore capacity requests, so a claim whose
// memory or compute-capability floor is one can land on a GPU below it. The
// plugin refuses it, saying why, instead of starting a workload that will
// run out of memory or find no kernel image for the GPU.
func TestPrepareRefusesAGPUBelowAHardNeed(t *testing.T) {
	needs := func(capacity resourceapi.QualifiedName, q string) *resourceapi.CapacityRequirements {
		return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{capacity: resource.MustParse(q)}}
	}
	exactly := func(c *resourceapi.CapacityRequirements) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: gpuv1alpha1.DriverName, Capacity: c}}
	}
	ladder := func(c *resourceapi.CapacityRequirements) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "fast", DeviceClassName: gpuv1alpha1.DriverName},
			{Name: "fits", DeviceClassName: gpuv1alpha1.DriverName, Capacity: c},
		}}
	}
	for _, tc := range []struct {
		name    string
		request resourceapi.DeviceRequest
		// allocated is the result's request name.
		allocated string
		// wantReason is the Event's reason, and wantText what the error
		// names; "": prepare succeeds.
		wantReason, wantText string
	}{
		{"no capacity request", exactly(nil), "gpu", "", ""},
		{"a memory request the T4 holds", exactly(needs(gpuv1alpha1.MemoryCapacity.Qualified(), "8Gi")), "gpu", "", ""},
		{"a memory request above the T4's", exactly(needs(gpuv1alpha1.MemoryCapacity.Qualified(), "39Gi")), "gpu", "MemoryRequestNotMet", "39Gi"},
		{"a subrequest above the T4's memory", ladder(needs(gpuv1alpha1.MemoryCapacity.Qualified(), "39Gi")), "gpu/fits", "MemoryRequestNotMet", "39Gi"},
		{"another subrequest was allocated", ladder(needs(gpuv1alpha1.MemoryCapacity.Qualified(), "39Gi")), "gpu/fast", "", ""},
		{"the T4's own compute capability (7.5)", exactly(needs(gpuv1alpha1.SMVersionCapacity.Qualified(), "75")), "gpu", "", ""},
		{"a compute capability above the T4's", ladder(needs(gpuv1alpha1.SMVersionCapacity.Qualified(), "80")), "gpu/fits", "ComputeCapabilityRequestNotMet", "smVersion 75"},
		{"a preference the T4 misses is not a need", exactly(needs(gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified(), "3150")), "gpu", "", ""},
		// The claim's author writes the request: a huge exponent used to
		// make the comparison run for minutes, per prepare.
		{"a memory request with a huge exponent", exactly(needs(gpuv1alpha1.MemoryCapacity.Qualified(), "1E1111011110")), "gpu", "MemoryRequestNotMet", "100e1111011108"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, "t4-2.yaml", t.TempDir())
			claim := allocatedClaim("uid-1", []string{"gpu-0"})
			claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{tc.request}
			claim.Status.Allocation.Devices.Results[0].Request = tc.allocated
			err := prepare(t, d, claim)["uid-1"].Err
			if (tc.wantReason != "") != (err != nil) {
				t.Fatalf("prepare error %v, want one: %v", err, tc.wantReason != "")
			}
			if err == nil {
				return
			}
			if !strings.Contains(err.Error(), "DRAConsumableCapacity") || !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q does not name %q and the feature gate", err, tc.wantText)
			}
			waitForEvent(t, d.cfg.KubeClient, tc.wantReason)
		})
	}
}
