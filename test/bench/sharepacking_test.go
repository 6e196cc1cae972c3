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

package bench

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// TestBestFitGPUs: first-fit-decreasing needs the fewest GPUs for shares of
// one size, counts both capacities, takes the GPUs in order and says when
// the shares do not fit.
func TestBestFitGPUs(t *testing.T) {
	// What an H100 80GB publishes shareable: 81559Mi (79.6 GiB) and 100 %.
	h100 := gpuv1alpha1.Share{MemoryBytes: 81559 << 20, ComputePercent: 100}
	small := gpuv1alpha1.Share{MemoryBytes: 24 << 30, ComputePercent: 100}
	gib := func(n int64) gpuv1alpha1.Share { return gpuv1alpha1.Share{MemoryBytes: n << 30} }
	times := func(n int, s gpuv1alpha1.Share) []gpuv1alpha1.Share {
		out := make([]gpuv1alpha1.Share, n)
		for i := range out {
			out[i] = s
		}
		return out
	}
	tests := []struct {
		name       string
		shares     []gpuv1alpha1.Share
		capacities []gpuv1alpha1.Share
		want       int
		wantFit    bool
	}{
		{"no shares", nil, times(8, h100), 0, true},
		{"16 of 20Gi, 3 a GPU", times(16, gib(20)), times(8, h100), 6, true},
		{"16 of 8Gi, 9 a GPU", times(16, gib(8)), times(8, h100), 2, true},
		{"16 of 8Gi and 20 %, compute holds 5 a GPU", times(16, gpuv1alpha1.Share{MemoryBytes: 8 << 30, ComputePercent: 20}), times(8, h100), 4, true},
		{"two 40Gi do not fit 79.6 GiB", times(3, gib(40)), times(8, h100), 3, true},
		{"largest first: the 19Gi ones fill the gaps beside two 60Gi", []gpuv1alpha1.Share{gib(19), gib(19), gib(60), gib(60)}, times(8, h100), 2, true},
		{"GPUs in order: the small first GPU takes one 20Gi", times(2, gib(20)), []gpuv1alpha1.Share{small, h100}, 2, true},
		{"more shares than GPUs hold", times(25, gib(20)), times(8, h100), 0, false},
		{"a share larger than any GPU", []gpuv1alpha1.Share{gib(80)}, times(8, h100), 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := bestFitGPUs(tt.shares, tt.capacities)
			if diff := cmp.Diff(tt.want, got); diff != "" || ok != tt.wantFit {
				t.Errorf("bestFitGPUs = %d, %t; want %d, %t (-want +got):\n%s", got, ok, tt.want, tt.wantFit, diff)
			}
		})
	}
}

// TestRuns: the order a stream's shares were bound in reads as runs of one
// device.
func TestRuns(t *testing.T) {
	tests := []struct {
		order []string
		want  string
	}{
		{nil, ""},
		{[]string{"gpu-0"}, "gpu-0 x1"},
		{[]string{"gpu-0", "gpu-0", "gpu-0", "gpu-1", "gpu-1", "gpu-0"}, "gpu-0 x3, gpu-1 x2, gpu-0 x1"},
	}
	for _, tt := range tests {
		if diff := cmp.Diff(tt.want, runs(tt.order)); diff != "" {
			t.Errorf("runs(%v) (-want +got):\n%s", tt.order, diff)
		}
	}
}
