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

package rewrite

import (
	"maps"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// TestSharingOf: a GpuConfig names the requests whose strategy it sets, or
// all of them; only a strategy the user wrote counts (a GpuConfig that
// names none defaults to Exclusive in the plugin, but says nothing here).
func TestSharingOf(t *testing.T) {
	config := func(parameters string, requests ...string) resourceapi.DeviceClaimConfiguration {
		return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.prism.dev", Parameters: runtime.RawExtension{Raw: []byte(parameters)}}}}
	}
	const (
		exclusive   = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"Exclusive"}}`
		timeSliced  = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing"}}`
		profiling   = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`
		foreignKind = `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"NicConfig","sharing":{"strategy":"Exclusive"}}`
	)
	type want struct{ Exclusive, NoShare []string }
	requests := []resourceapi.DeviceRequest{{Name: "a"}, {Name: "b"}}
	for _, tc := range []struct {
		name    string
		configs []resourceapi.DeviceClaimConfiguration
		want    want
	}{
		{"no config", nil, want{}},
		{"Exclusive for a named request", []resourceapi.DeviceClaimConfiguration{config(exclusive, "b")}, want{Exclusive: []string{"b"}}},
		{"Exclusive for every request", []resourceapi.DeviceClaimConfiguration{config(exclusive)}, want{Exclusive: []string{"a", "b"}}},
		{"TimeSlicing for a named request", []resourceapi.DeviceClaimConfiguration{config(timeSliced, "b")}, want{NoShare: []string{"b"}}},
		{"TimeSlicing for every request", []resourceapi.DeviceClaimConfiguration{config(timeSliced)}, want{NoShare: []string{"a", "b"}}},
		{"one of each", []resourceapi.DeviceClaimConfiguration{config(exclusive, "a"), config(timeSliced, "b")}, want{Exclusive: []string{"a"}, NoShare: []string{"b"}}},
		{"defaulted, not written", []resourceapi.DeviceClaimConfiguration{config(profiling)}, want{}},
		{"another kind", []resourceapi.DeviceClaimConfiguration{config(foreignKind)}, want{}},
		{"not JSON", []resourceapi.DeviceClaimConfiguration{config(`{`)}, want{}},
		{"another driver", []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
			Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "nic.example.com", Parameters: runtime.RawExtension{Raw: []byte(exclusive)}}}}}, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := sharingOf(&resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests, Config: tc.configs}})
			got := want{Exclusive: slices.Sorted(maps.Keys(s.exclusive)), NoShare: slices.Sorted(maps.Keys(s.noShare))}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("sharing strategies written (-want +got):\n%s", diff)
			}
		})
	}
}
