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

package webhook

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

func TestWithinAPILimits(t *testing.T) {
	requests := func(n int, fill func(*resourceapi.DeviceRequest)) resourceapi.ResourceClaimSpec {
		var spec resourceapi.ResourceClaimSpec
		for i := range n {
			r := resourceapi.DeviceRequest{Name: fmt.Sprintf("r%d", i), Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.prism.dev"}}
			if fill != nil {
				fill(&r)
			}
			spec.Devices.Requests = append(spec.Devices.Requests, r)
		}
		return spec
	}
	selectors := func(n int) []resourceapi.DeviceSelector {
		return make([]resourceapi.DeviceSelector, n)
	}
	for _, tc := range []struct {
		name    string
		spec    resourceapi.ResourceClaimSpec
		wantErr string
	}{
		{name: "at every limit", spec: requests(resourceapi.DeviceRequestsMaxSize, func(r *resourceapi.DeviceRequest) {
			r.Exactly.Selectors = selectors(resourceapi.DeviceSelectorsMaxSize)
		})},
		{name: "too many requests", spec: requests(resourceapi.DeviceRequestsMaxSize+1, nil), wantErr: "33 requests, 0 constraints and 0 configs: beyond the API's limits (32, 32, 32)"},
		{name: "too many selectors", spec: requests(1, func(r *resourceapi.DeviceRequest) {
			r.Exactly.Selectors = selectors(resourceapi.DeviceSelectorsMaxSize + 1)
		}), wantErr: `request "r0" has 33 selectors`},
		{name: "too many subrequests", spec: requests(1, func(r *resourceapi.DeviceRequest) {
			r.Exactly = nil
			r.FirstAvailable = make([]resourceapi.DeviceSubRequest, resourceapi.FirstAvailableDeviceRequestMaxSize+1)
		}), wantErr: `request "r0" has 9 subrequests`},
		{name: "too many selectors in a subrequest", spec: requests(1, func(r *resourceapi.DeviceRequest) {
			r.Exactly = nil
			r.FirstAvailable = []resourceapi.DeviceSubRequest{{Name: "s", Selectors: selectors(resourceapi.DeviceSelectorsMaxSize + 1)}}
		}), wantErr: `subrequest "s" has 33 selectors`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := WithinAPILimits(&tc.spec)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if tc.wantErr == "" && got != "" || tc.wantErr != "" && (len(got) < len(tc.wantErr) || got[:len(tc.wantErr)] != tc.wantErr) {
				t.Errorf("error %q, want one starting %q", got, tc.wantErr)
			}
		})
	}
}

// TestProfileOfCarriesWhatTheRewriteReads: the measured figures of a
// WorkloadProfile reach the rewrite, ncu's kernel shape among them.
func TestProfileOfCarriesWhatTheRewriteReads(t *testing.T) {
	waves := resource.MustParse("0.05")
	wp := &prismv1alpha1.WorkloadProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "infer"},
		Spec:       prismv1alpha1.WorkloadProfileSpec{Sharing: prismv1alpha1.SharingExclusive},
		Status: prismv1alpha1.WorkloadProfileStatus{
			BoundType: prismv1alpha1.BoundTypeLatencyBound, WavesPerSM: &waves, DRAMThroughputMilliPercent: ptr.To[int32](2000),
			Usage: &prismv1alpha1.UsageProfile{Runs: 2},
		},
	}
	got := ProfileOf(wp, prismv1alpha1.PolicyEconomy)
	want := rewrite.Profile{
		Name: "infer", BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy,
		Usage: wp.Status.Usage, Exclusive: true,
		Kernels: rewrite.KernelShape{WavesPerSM: &waves, DRAMThroughputMilliPercent: ptr.To[int32](2000)},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ProfileOf (-want +got):\n%s", diff)
	}
}
