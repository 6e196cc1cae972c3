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

package soak

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/profiling"
)

func TestOverAllocated(t *testing.T) {
	memory := gpuv1alpha1.MemoryCapacity.Qualified()
	slice := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: gpuv1alpha1.DriverName, Pool: resourceapi.ResourcePool{Name: "node"},
		Devices: []resourceapi.Device{
			{Name: "gpu-0", Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{memory: {Value: resource.MustParse("16Gi")}}},
		},
	}}
	claim := func(name string, share string) resourceapi.ResourceClaim {
		r := resourceapi.DeviceRequestAllocationResult{Driver: gpuv1alpha1.DriverName, Pool: "node", Device: "gpu-0"}
		if share != "" {
			r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{memory: resource.MustParse(share)}
		}
		return resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name},
			Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{
				Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{r}},
			}},
		}
	}
	tests := []struct {
		name   string
		claims []resourceapi.ResourceClaim
		want   []string
	}{
		{name: "one whole", claims: []resourceapi.ResourceClaim{claim("a", "")}},
		{name: "shares that fit", claims: []resourceapi.ResourceClaim{claim("a", "8Gi"), claim("b", "8Gi")}},
		{name: "shares beyond the memory", claims: []resourceapi.ResourceClaim{claim("a", "8Gi"), claim("b", "9Gi")},
			want: []string{"device node/gpu-0 allocated 17Gi of its 16Gi memory, to ns/a, ns/b"}},
		{name: "whole and a share", claims: []resourceapi.ResourceClaim{claim("a", ""), claim("b", "1Gi")},
			want: []string{"device node/gpu-0 allocated 17Gi of its 16Gi memory, to ns/a, ns/b"}},
		{name: "whole twice", claims: []resourceapi.ResourceClaim{claim("a", ""), claim("b", "")},
			want: []string{"device node/gpu-0 allocated 32Gi of its 16Gi memory, to ns/a, ns/b"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := overAllocated([]resourceapi.ResourceSlice{slice}, tc.claims)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("overAllocated (-want +got):\n%s", diff)
			}
		})
	}
}

// TestPreparedUIDs: what a node holds for claims is read from the CDI
// specs and the report directories, and the plugin's own directories
// beside those are not taken for claims.
func TestPreparedUIDs(t *testing.T) {
	cdiRoot, state := t.TempDir(), t.TempDir()
	const uidA, uidB = "11111111-2222-3333-4444-555555555555", "66666666-7777-8888-9999-000000000000"
	for _, f := range []string{cdi.SpecFileName(uidA), "nvidia.com-gpu.json"} {
		if err := os.WriteFile(filepath.Join(cdiRoot, f), []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	profiles := filepath.Dir(filepath.Dir(profiling.ClaimDir(state, uidB)))
	for _, d := range []string{profiling.ClaimDir(state, uidB), filepath.Join(profiles, "archive", "x"), filepath.Join(profiles, "collect", "job-1")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	want := []prepared{{"CDI spec", uidA}, {"report directory", uidB}, {"queued collection job-1", "none"}}
	if diff := cmp.Diff(want, preparedUIDs(cdiRoot, state), cmp.AllowUnexported(prepared{})); diff != "" {
		t.Errorf("preparedUIDs (-want +got):\n%s", diff)
	}
}

// TestShareDaemonClaim: an MPS daemon's key names its share's claim; any
// other key names none, so that its daemon is always left over.
func TestShareDaemonClaim(t *testing.T) {
	const uid = "0b6d3f2e-1c4a-4e8b-9f00-1234567890ab"
	for key, want := range map[string]string{
		uid + "-gpu-0":  uid,
		uid + "-gpu-10": uid,
		"GPU-360dbf39-7803-d831-7b55-f6826f9857d7": "none",
		uid:                 "none",
		uid + "gpu-0":       "none",
		"not-a-claim-gpu-0": "none",
	} {
		if got := shareDaemonClaim(key); got != want {
			t.Errorf("shareDaemonClaim(%q) = %q, want %q", key, got, want)
		}
	}
}
