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
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/google/go-cmp/cmp"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestMemoryFloorForm: the capacity request replaces the CEL floor only
// where the caller asked for it, the claim wants a whole GPU, and no GPU of
// a known fleet is published shareable; the plan says which form was used.
func TestMemoryFloorForm(t *testing.T) {
	shared := e2eFleet(0)
	shared.Models[2].SharedDevices = 4
	for _, tc := range []struct {
		name    string
		profile Profile
		// userAmount is a memory amount the claim names itself.
		userAmount string
		opts       []Option
		// wantPlan is the start of Plan.MemoryFloor.
		wantPlan    string
		wantRequest string
		wantCEL     bool
		// strategy is the sharing strategy of the claim's GpuConfig, ""
		// for none.
		strategy gpuv1alpha1.SharingStrategy
	}{
		{"not asked: CEL", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", nil, "", "", true, ""},
		{"no fleet known: capacity", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", []Option{MemoryFloorAsCapacity()}, string(FormCapacity), "39Gi", false, ""},
		{"fleet without shareable GPUs: capacity", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", []Option{WithFleet(e2eFleet(0)), MemoryFloorAsCapacity()}, string(FormCapacity), "39Gi", false, ""},
		{"fleet with shareable GPUs: CEL", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", []Option{WithFleet(shared), MemoryFloorAsCapacity()}, string(FormCEL) + ": 4 GPUs are published shareable", "", true, ""},
		{"affinity on a fleet without shareable GPUs: capacity", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", []Option{WithFleet(e2eFleet(0)), WithPreference(PreferAffinity), MemoryFloorAsCapacity()}, string(FormCapacity), "39Gi", false, ""},
		{"the claim's own amount stays the request", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "30Gi", []Option{WithFleet(e2eFleet(0)), MemoryFloorAsCapacity()}, string(FormCEL) + ": every rewritten request names its own", "30Gi", true, ""},
		{"a memory share is a share, not a floor", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi"), ShareMemory: true}, "", []Option{WithFleet(e2eFleet(0)), MemoryFloorAsCapacity()}, "", "24Gi", true, ""},
		// An amount of memory would make a time-sliced request a share,
		// which the validating webhook refuses.
		{"a time-sliced request keeps the floor in CEL", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi")}, "", []Option{WithFleet(e2eFleet(0)), MemoryFloorAsCapacity()},
			string(FormCEL) + ": every rewritten request names its own gpu.prism.dev/memory amount, or has a GpuConfig whose sharing strategy a share cannot take", "", true, gpuv1alpha1.TimeSlicingSharing},
		{"a time-sliced request gets no memory share", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("20Gi"), ShareMemory: true}, "", []Option{WithFleet(e2eFleet(0)), MemoryFloorAsCapacity()}, "", "", true, gpuv1alpha1.TimeSlicingSharing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := exactGPU("gpu", 1)
			if tc.userAmount != "" {
				req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse(tc.userAmount)}}
			}
			spec := gpuSpec(req)
			if tc.strategy != "" {
				spec = withSharing(spec, tc.strategy)
			}
			out, plan, err := Rewrite(context.Background(), spec, tc.profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if got := plan.MemoryFloor.String(); !strings.HasPrefix(got, tc.wantPlan) || (tc.wantPlan == "") != plan.MemoryFloor.IsZero() {
				t.Errorf("plan.MemoryFloor %q, want it to start with %q", plan.MemoryFloor, tc.wantPlan)
			}
			subs := out.Devices.Requests[0].FirstAvailable
			if len(subs) == 0 {
				t.Fatalf("request not rewritten: %+v", out.Devices.Requests[0])
			}
			for _, sub := range subs {
				hasCEL := false
				for _, s := range exprs(sub.Selectors) {
					hasCEL = hasCEL || s == memoryAtLeast(39)
				}
				if hasCEL != tc.wantCEL || memoryRequest(sub) != tc.wantRequest {
					t.Errorf("tier %s: CEL floor %v (want %v), memory request %q (want %q)", sub.Name, hasCEL, tc.wantCEL, memoryRequest(sub), tc.wantRequest)
				}
			}
		})
	}
}

// TestFormChoiceInThePlan: a form choice is one string in the plan's
// annotation, as people read it, and reads back typed; a choice not asked
// for is left out.
func TestFormChoiceInThePlan(t *testing.T) {
	for _, tc := range []struct {
		name   string
		choice FormChoice
		// field is the plan's memoryFloor field as written, "" for none.
		field string
	}{
		{"not asked", FormChoice{}, ""},
		{"capacity", FormChoice{Form: FormCapacity}, `"memoryFloor":"capacity"`},
		{"declined", FormChoice{Form: FormCEL, Why: "4 GPUs are published shareable: a share"}, `"memoryFloor":"cel: 4 GPUs are published shareable: a share"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, err := json.Marshal(Plan{MemoryFloor: tc.choice})
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.field == "" && strings.Contains(string(data), "memoryFloor"):
				t.Errorf("plan JSON %s names a memory floor that was not asked for", data)
			case tc.field != "" && !strings.Contains(string(data), tc.field):
				t.Errorf("plan JSON %s, want it to hold %s", data, tc.field)
			}
			var back Plan
			if err := json.Unmarshal(data, &back); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.choice, back.MemoryFloor); diff != "" {
				t.Errorf("read back (-want +got):\n%s", diff)
			}
		})
	}
	var p Plan
	if err := json.Unmarshal([]byte(`{"memoryFloor":"fast"}`), &p); err == nil {
		t.Error("a plan with an unknown form reads back without an error")
	}
}

// sharingConfig is a claim's GpuConfig that sets the sharing strategy of
// the requests named, or of all where none is.
func sharingConfig(strategy gpuv1alpha1.SharingStrategy, requests ...string) []resourceapi.DeviceClaimConfiguration {
	raw := fmt.Sprintf(`{"apiVersion":%q,"kind":%q,"sharing":{"strategy":%q}}`, gpuv1alpha1.SchemeGroupVersion, gpuv1alpha1.GpuConfigKind, strategy)
	return []resourceapi.DeviceClaimConfiguration{{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: gpuv1alpha1.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)}},
	}}}
}

// withSharing gives spec a GpuConfig that sets the sharing strategy of
// every request.
func withSharing(spec *resourceapi.ResourceClaimSpec, strategy gpuv1alpha1.SharingStrategy) *resourceapi.ResourceClaimSpec {
	spec.Devices.Config = sharingConfig(strategy)
	return spec
}
