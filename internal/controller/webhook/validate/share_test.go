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

package validate

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// One denial per config, naming the first few shares it reaches and
// counting the rest, so that a claim of many requests gets a short reason.
func TestShareStrategyErrorsNameAFewShares(t *testing.T) {
	memory := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse("4Gi")}}
	compute := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.ComputeCapacity.Qualified(): resource.MustParse("10")}}
	spec := &resourceapi.ResourceClaimSpec{}
	for i := range 5 {
		c := memory
		if i == 4 {
			c = compute
		}
		spec.Devices.Requests = append(spec.Devices.Requests, resourceapi.DeviceRequest{Name: fmt.Sprintf("r%d", i), Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.prism.dev", Capacity: c}})
	}
	spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver:     gpuv1alpha1.DriverName,
		Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`)},
	}}}}
	errs := shareStrategyErrors(spec, field.NewPath("spec", "devices", "config"))
	want := `spec.devices.config[0].opaque.parameters.sharing.strategy: Invalid value: "TimeSlicing": ` +
		`requests "r0", "r1", "r2" and 2 more, which name amounts of gpu.prism.dev/memory or gpu.prism.dev/compute, ask for shares of a GPU: ` +
		`a share cannot be time-sliced: a time slice is set for the whole GPU, which other claims' shares run on; ` +
		`remove the sharing configuration, or the amounts to ask for a whole GPU`
	if len(errs) != 1 || errs[0].Error() != want {
		t.Errorf("errors %q\nwant one: %s", errs, want)
	}
}
