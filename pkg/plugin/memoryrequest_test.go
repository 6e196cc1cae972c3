package plugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// TestPrepareRefusesAGPUBelowTheMemoryRequest: a scheduler without
// DRAConsumableCapacity ignores capacity requests, so a claim whose memory
// floor is one can land on a GPU that is too small. The plugin refuses it,
// saying why, instead of starting a workload that will run out of memory.
func TestPrepareRefusesAGPUBelowTheMemoryRequest(t *testing.T) {
	memory := func(q string) *resourceapi.CapacityRequirements {
		return &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{memoryCapacity: resource.MustParse(q)}}
	}
	exactly := func(c *resourceapi.CapacityRequirements) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DriverName, Capacity: c}}
	}
	ladder := func(c *resourceapi.CapacityRequirements) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "fast", DeviceClassName: DriverName},
			{Name: "fits", DeviceClassName: DriverName, Capacity: c},
		}}
	}
	for _, tc := range []struct {
		name    string
		request resourceapi.DeviceRequest
		// allocated is the result's request name.
		allocated string
		wantErr   bool
	}{
		{"no capacity request", exactly(nil), "gpu", false},
		{"a request the T4 holds", exactly(memory("8Gi")), "gpu", false},
		{"a request above the T4's memory", exactly(memory("39Gi")), "gpu", true},
		{"a subrequest above the T4's memory", ladder(memory("39Gi")), "gpu/fits", true},
		{"another subrequest was allocated", ladder(memory("39Gi")), "gpu/fast", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, "t4-2.yaml", t.TempDir())
			claim := allocatedClaim("uid-1", []string{"gpu-0"})
			claim.Spec.Devices.Requests = []resourceapi.DeviceRequest{tc.request}
			claim.Status.Allocation.Devices.Results[0].Request = tc.allocated
			err := prepare(t, d, claim)["uid-1"].Err
			if tc.wantErr != (err != nil) {
				t.Fatalf("prepare error %v, want one: %v", err, tc.wantErr)
			}
			if err == nil {
				return
			}
			if !strings.Contains(err.Error(), "DRAConsumableCapacity") || !strings.Contains(err.Error(), "39Gi") {
				t.Errorf("error %q does not name the request and the feature gate", err)
			}
			waitForEvent(t, d.cfg.KubeClient, "MemoryRequestNotMet")
		})
	}
}
