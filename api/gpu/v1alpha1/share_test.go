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

package v1alpha1

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

func TestSharedCapacities(t *testing.T) {
	amounts := func(names ...resourceapi.QualifiedName) *resourceapi.CapacityRequirements {
		c := &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{}}
		for _, n := range names {
			c.Requests[n] = resource.MustParse("1")
		}
		return c
	}
	for _, tc := range []struct {
		name string
		c    *resourceapi.CapacityRequirements
		want []CapacityName
	}{
		{"none", nil, nil},
		{"empty", amounts(), nil},
		{"memory", amounts(MemoryCapacity.Qualified()), []CapacityName{MemoryCapacity}},
		{"compute and memory", amounts(MemoryCapacity.Qualified(), ComputeCapacity.Qualified()), []CapacityName{ComputeCapacity, MemoryCapacity}},
		// A lower bound on a figure is no share: only shareable GPUs'
		// capacities are.
		{"a figure", amounts(SMVersionCapacity.Qualified(), FP32GFLOPSCapacity.Qualified()), nil},
		{"another driver's memory", amounts("nic.example.com/memory"), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, SharedCapacities(tc.c)); diff != "" {
				t.Errorf("shared capacities (-want +got):\n%s", diff)
			}
		})
	}
}

func TestShareConflict(t *testing.T) {
	for _, tc := range []struct {
		strategy SharingStrategy
		conflict bool
	}{
		{"", false},
		{ExclusiveSharing, false},
		{TimeSlicingSharing, true},
		{"Sometimes", true},
	} {
		if err := tc.strategy.ShareConflict(); (err != nil) != tc.conflict {
			t.Errorf("strategy %q: conflict %v, want %v", tc.strategy, err, tc.conflict)
		}
	}
}

func TestShareRange(t *testing.T) {
	for _, tc := range []struct {
		name    string
		share   Share
		wantErr bool
	}{
		{"no amounts", Share{}, false},
		{"a share", Share{ComputePercent: 45, MemoryBytes: 8 << 30}, false},
		{"the whole GPU's compute", Share{ComputePercent: MaxComputePercent}, false},
		{"more than the GPU", Share{ComputePercent: MaxComputePercent + 1}, true},
		{"negative compute", Share{ComputePercent: -1}, true},
		{"negative memory", Share{MemoryBytes: -1}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.share.Validate(); (err != nil) != tc.wantErr {
				t.Errorf("Validate() = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}

func TestShareString(t *testing.T) {
	for _, tc := range []struct {
		share Share
		want  string
	}{
		{Share{ComputePercent: 45, MemoryBytes: 8 << 30}, "45% compute, 8Gi memory"},
		{Share{MemoryBytes: 20 << 30}, "20Gi memory"},
		{Share{ComputePercent: 45}, "45% compute"},
		{Share{}, "no amounts"},
	} {
		if diff := cmp.Diff(tc.want, tc.share.String()); diff != "" {
			t.Errorf("String of %#v (-want +got):\n%s", tc.share, diff)
		}
	}
}

// TestShareLimits holds the one reading of the range: 0 and the whole
// GPU's compute are no compute limit, 0 bytes no memory limit.
func TestShareLimits(t *testing.T) {
	type limits struct{ Compute, Memory bool }
	for _, tc := range []struct {
		name  string
		share Share
		want  limits
	}{
		{"no amounts", Share{}, limits{}},
		{"a share", Share{ComputePercent: 45, MemoryBytes: 8 << 30}, limits{Compute: true, Memory: true}},
		{"the least compute", Share{ComputePercent: 1}, limits{Compute: true}},
		{"the most compute below the whole GPU", Share{ComputePercent: MaxComputePercent - 1}, limits{Compute: true}},
		{"the whole GPU's compute", Share{ComputePercent: MaxComputePercent, MemoryBytes: 1}, limits{Memory: true}},
		{"above the whole GPU's compute", Share{ComputePercent: MaxComputePercent + 1}, limits{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := limits{Compute: tc.share.LimitsCompute(), Memory: tc.share.LimitsMemory()}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("limits (-want +got):\n%s", diff)
			}
		})
	}
}

func TestConsumedShare(t *testing.T) {
	consumed := func(compute, memory string) map[resourceapi.QualifiedName]resource.Quantity {
		c := map[resourceapi.QualifiedName]resource.Quantity{}
		if compute != "" {
			c[ComputeCapacity.Qualified()] = resource.MustParse(compute)
		}
		if memory != "" {
			c[MemoryCapacity.Qualified()] = resource.MustParse(memory)
		}
		return c
	}
	for _, tc := range []struct {
		name     string
		consumed map[resourceapi.QualifiedName]resource.Quantity
		want     Share
	}{
		{"none counted", nil, Share{}},
		{"compute and memory", consumed("45", "8Gi"), Share{ComputePercent: 45, MemoryBytes: 8 << 30}},
		{"memory alone", consumed("", "20Gi"), Share{MemoryBytes: 20 << 30}},
		// More than the whole GPU's compute, as a GPU published with more
		// would let the scheduler count, is the whole GPU's, and does not
		// wrap an int32.
		{"compute above the whole GPU", consumed("5000000000", ""), Share{ComputePercent: MaxComputePercent}},
		{"another driver's memory", map[resourceapi.QualifiedName]resource.Quantity{"nic.example.com/memory": resource.MustParse("1Gi")}, Share{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, ConsumedShare(tc.consumed)); diff != "" {
				t.Errorf("consumed share (-want +got):\n%s", diff)
			}
		})
	}
}

// TestGrantedComputeLimit: a share is capped only where its config asks,
// at what it asks, but never below its own compute nor past twice it.
func TestGrantedComputeLimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		share Share
		asked *int32
		want  int32
	}{
		{"nothing asked: no cap", Share{ComputePercent: 30}, nil, 0},
		{"within twice the share", Share{ComputePercent: 30}, ptr.To[int32](55), 55},
		{"twice the share at most", Share{ComputePercent: 30}, ptr.To[int32](90), 60},
		{"the whole GPU at most", Share{ComputePercent: 70}, ptr.To[int32](100), 100},
		{"below the share: the share", Share{ComputePercent: 30}, ptr.To[int32](10), 30},
		{"the share itself", Share{ComputePercent: 30}, ptr.To[int32](30), 30},
		{"a share of no compute has no cap", Share{MemoryBytes: 8 << 30}, ptr.To[int32](50), 0},
		{"a share of the whole GPU's compute", Share{ComputePercent: MaxComputePercent}, ptr.To[int32](50), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.share.GrantedComputeLimit(tc.asked); got != tc.want {
				t.Errorf("GrantedComputeLimit(%v) of %v = %d, want %d", tc.asked, tc.share, got, tc.want)
			}
		})
	}
}
