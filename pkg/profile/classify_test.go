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

package profile

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

func TestClassify(t *testing.T) {
	const (
		compute  = v1alpha1.BoundTypeComputeBound
		memory   = v1alpha1.BoundTypeMemoryBound
		latency  = v1alpha1.BoundTypeLatencyBound
		balanced = v1alpha1.BoundTypeBalanced
	)
	tests := []struct {
		name    string
		sm, mem int32
		want    v1alpha1.BoundType
	}{
		{"idle", 0, 0, latency},
		{"both just under 60", 59_999, 59_999, latency},
		{"SM at 60, memory idle: compute-heavy", 60_000, 0, compute},
		{"gap of exactly 10 points", 55_000, 65_000, memory},
		{"gap just under 10 points", 65_000, 55_001, balanced},
		{"equal and moderate", 70_000, 70_000, balanced},
		{"SM at 80 wins over 79.999", 80_000, 79_999, compute},
		{"memory at 80 wins over 79.999", 79_999, 80_000, memory},
		{"both high, memory larger", 85_000, 95_000, memory},
		{"both high, SM larger by under 10", 88_000, 82_000, compute},
		{"both saturated equally", 90_000, 90_000, balanced},
		{"both under 80, close", 79_999, 75_000, balanced},
		{"vector add", 20_410, 90_120, memory},
		{"FMA loop", 91_300, 9_800, compute},
		{"tiny grid", 3_210, 1_870, latency},
		{"SM at 100", 100_000, 0, compute},
	}
	for _, tc := range tests {
		if got := Classify(tc.sm, tc.mem); got != tc.want {
			t.Errorf("%s: Classify(%d, %d) = %s, want %s", tc.name, tc.sm, tc.mem, got, tc.want)
		}
	}
}

// TestRoofline: the condition exists only when the roofline can judge the
// class, so that it is not the same "cannot tell" on every profile.
func TestRoofline(t *testing.T) {
	const h100FLOPS, h100Bandwidth = 67e12, 3.35e12 // ridge point 20 FLOP/byte
	tests := []struct {
		name         string
		bound        v1alpha1.BoundType
		flops, bytes float64
		peakFLOPS    float64
		// want is empty when no condition is to be set.
		want   metav1.ConditionStatus
		reason string
	}{
		{"memory-bound below the ridge", v1alpha1.BoundTypeMemoryBound, 1e9, 12e9, h100FLOPS, metav1.ConditionTrue, v1alpha1.ReasonRooflineAgrees},
		{"compute-bound above the ridge", v1alpha1.BoundTypeComputeBound, 1e12, 1e9, h100FLOPS, metav1.ConditionTrue, v1alpha1.ReasonRooflineAgrees},
		{"compute-bound below the ridge", v1alpha1.BoundTypeComputeBound, 1e9, 1e9, h100FLOPS, metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees},
		{"memory-bound above the ridge", v1alpha1.BoundTypeMemoryBound, 1e12, 1e9, h100FLOPS, metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees},
		{"latency-bound is not judged", v1alpha1.BoundTypeLatencyBound, 1e9, 1e9, h100FLOPS, "", ""},
		{"balanced is not judged", v1alpha1.BoundTypeBalanced, 1e9, 1e9, h100FLOPS, "", ""},
		{"no FP32 work", v1alpha1.BoundTypeMemoryBound, 0, 1e9, h100FLOPS, "", ""},
		{"no DRAM bytes", v1alpha1.BoundTypeComputeBound, 1e9, 0, h100FLOPS, "", ""},
		{"unknown device", v1alpha1.BoundTypeComputeBound, 1e9, 1e9, 0, "", ""},
	}
	for _, tc := range tests {
		c, judged := roofline(tc.bound, tc.flops, tc.bytes, tc.peakFLOPS, h100Bandwidth)
		if judged != (tc.want != "") {
			t.Errorf("%s: judged = %v (%s: %s), want %v", tc.name, judged, c.Reason, c.Message, tc.want != "")
			continue
		}
		if !judged {
			continue
		}
		// A sentence for a person: capitalised, ending in a full stop.
		if c.Type != v1alpha1.ConditionRooflineConsistent || c.Status != tc.want || c.Reason != tc.reason ||
			!strings.HasSuffix(c.Message, ".") || strings.ToUpper(c.Message[:1]) != c.Message[:1] {
			t.Errorf("%s: got %s=%s (%s) %q, want %s (%s) with a sentence", tc.name, c.Type, c.Status, c.Reason, c.Message, tc.want, tc.reason)
		}
	}
}

func TestPeaksOf(t *testing.T) {
	tests := []struct {
		product string
		flops   float64
		ok      bool
	}{
		{"NVIDIA H100 80GB HBM3", 67e12, true},
		{"NVIDIA H100 PCIe", 51.2e12, true},
		{"NVIDIA A100-SXM4-40GB", 19.5e12, true},
		{"NVIDIA A10", 31.2e12, true},
		{"NVIDIA L40S", 91.6e12, true},
		{"NVIDIA L4", 30.3e12, true},
		{"NVIDIA GeForce RTX 2080", 0, false},
	}
	for _, tc := range tests {
		flops, bw, ok := peaksOf(tc.product)
		if flops != tc.flops || ok != tc.ok || ok != (bw > 0) {
			t.Errorf("peaksOf(%q) = %v, %v, %v; want %v, %v", tc.product, flops, bw, ok, tc.flops, tc.ok)
		}
	}
}
