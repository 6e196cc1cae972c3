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
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// The classes, short, for the tables.
const (
	compute  = v1alpha1.BoundTypeComputeBound
	memory   = v1alpha1.BoundTypeMemoryBound
	latency  = v1alpha1.BoundTypeLatencyBound
	balanced = v1alpha1.BoundTypeBalanced
)

func TestClassify(t *testing.T) {
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

// TestClassifyShares: a workload takes the class that holds the most GPU
// time; the table is mostly the tie rule.
func TestClassifyShares(t *testing.T) {
	type shares = v1alpha1.BoundTimeShares
	tests := []struct {
		name   string
		shares shares
		want   v1alpha1.BoundType
	}{
		{"nothing classified", shares{}, v1alpha1.BoundTypeUnknown},
		{"all memory-bound", shares{MemoryBoundMilliPercent: 100_000}, memory},
		{"the H200's mixed job", shares{MemoryBoundMilliPercent: 75_900, ComputeBoundMilliPercent: 22_600, LatencyBoundMilliPercent: 1_500}, memory},
		{"latency-bound majority", shares{LatencyBoundMilliPercent: 50_001, ComputeBoundMilliPercent: 49_999}, latency},
		{"balanced majority", shares{BalancedMilliPercent: 40_000, ComputeBoundMilliPercent: 30_000, MemoryBoundMilliPercent: 30_000}, balanced},
		{"compute and memory tie", shares{ComputeBoundMilliPercent: 50_000, MemoryBoundMilliPercent: 50_000}, balanced},
		{"compute, memory and latency tie", shares{ComputeBoundMilliPercent: 33_333, MemoryBoundMilliPercent: 33_333, LatencyBoundMilliPercent: 33_333}, balanced},
		{"all four tie", shares{ComputeBoundMilliPercent: 25_000, MemoryBoundMilliPercent: 25_000, LatencyBoundMilliPercent: 25_000, BalancedMilliPercent: 25_000}, balanced},
		{"memory and latency tie", shares{MemoryBoundMilliPercent: 50_000, LatencyBoundMilliPercent: 50_000}, memory},
		{"compute and latency tie", shares{ComputeBoundMilliPercent: 50_000, LatencyBoundMilliPercent: 50_000}, compute},
		{"compute and balanced tie", shares{ComputeBoundMilliPercent: 45_000, BalancedMilliPercent: 45_000, MemoryBoundMilliPercent: 10_000}, compute},
		{"memory and balanced tie", shares{MemoryBoundMilliPercent: 45_000, BalancedMilliPercent: 45_000, ComputeBoundMilliPercent: 10_000}, memory},
		{"balanced and latency tie", shares{BalancedMilliPercent: 50_000, LatencyBoundMilliPercent: 50_000}, balanced},
		{"compute and memory tie below latency", shares{ComputeBoundMilliPercent: 30_000, MemoryBoundMilliPercent: 30_000, LatencyBoundMilliPercent: 40_000}, latency},
		// Each share is rounded on its own: the sum may miss 100000.
		{"rounded shares", shares{MemoryBoundMilliPercent: 66_667, ComputeBoundMilliPercent: 33_333, LatencyBoundMilliPercent: 1}, memory},
	}
	for _, tc := range tests {
		if got := ClassifyShares(tc.shares); got != tc.want {
			t.Errorf("%s: ClassifyShares(%+v) = %s, want %s", tc.name, tc.shares, got, tc.want)
		}
	}
}

// launch is n rows of a raw report: a kernel name, the duration of each
// launch and its SM and memory throughput in percent.
type launch struct {
	kernel      string
	n           int
	ns, sm, mem float64
}

// rawReport writes launches as ncu's raw page with the three metrics the
// class is made of.
func rawReport(launches ...launch) string {
	var b strings.Builder
	b.WriteString(`"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"` + "\n")
	b.WriteString(`"","","ns","%","%"` + "\n")
	id := 0
	for _, l := range launches {
		for range l.n {
			fmt.Fprintf(&b, "\"%d\",\"%s\",\"%g\",\"%g\",\"%g\"\n", id, l.kernel, l.ns, l.sm, l.mem)
			id++
		}
	}
	return b.String()
}

// TestClassByGPUTime: each kernel is classified by its own throughputs and
// the workload takes the class holding the most GPU time, where the
// averaged throughputs would blur two bounds into neither.
func TestClassByGPUTime(t *testing.T) {
	const (
		vectorAdd = "vectorAdd(const float *, const float *, float *, int)"
		fmaLoop   = "fmaLoop(const float *, float *)"
		tiny      = "tinyKernel(const float *, float *)"
	)
	type shares = v1alpha1.BoundTimeShares
	// class is what the test compares: the class and the shares it is
	// decided on, the averaged throughputs the status keeps beside them,
	// and, for the record, what Classify makes of those.
	type class struct {
		Bound      v1alpha1.BoundType
		Shares     shares
		SM, Memory int32
		Averaged   v1alpha1.BoundType
	}
	tests := []struct {
		name     string
		launches []launch
		want     class
	}{
		// hack/gpu-check's mixed job as an H200 ran it: vectorAdd 75.9 % of
		// the time at 41.1 % SM and 69.8 % memory, fmaLoop 22.6 % at 97.5 %
		// SM, four tiny launches the rest. The means are both under 60 %
		// (53.3 % and 53.0 % on the H200), which the averaged rule took for
		// LatencyBound; three quarters of the time is memory-bound.
		{"H200 mixed", []launch{{vectorAdd, 2, 379_500, 41.1, 69.8}, {fmaLoop, 1, 226_000, 97.5, 0.37}, {tiny, 4, 3_750, 0.16, 10.5}},
			class{memory, shares{MemoryBoundMilliPercent: 75_900, ComputeBoundMilliPercent: 22_600, LatencyBoundMilliPercent: 1_500}, 53_232, 53_219, latency}},
		// The same job on an H100, whose slower memory keeps vectorAdd
		// longer: both rules say MemoryBound.
		{"H100 mixed", []launch{{vectorAdd, 2, 395_000, 33.4, 82.0}, {fmaLoop, 1, 193_000, 97.3, 0.37}, {tiny, 4, 4_250, 0.16, 10.5}},
			class{memory, shares{MemoryBoundMilliPercent: 79_000, ComputeBoundMilliPercent: 19_300, LatencyBoundMilliPercent: 1_700}, 45_168, 65_030, memory}},
		// Small grids of two kernels, neither unit near 60 %:
		// (0.2*30000 + 5*16000) / 46000 = 1.8696 % SM, (11.5*30000 + 30*16000) / 46000 = 17.9348 % memory.
		{"latency-bound", []launch{{tiny, 10, 3_000, 0.2, 11.5}, {"smallCopy(float *)", 2, 8_000, 5, 30}},
			class{latency, shares{LatencyBoundMilliPercent: 100_000}, 1_870, 17_935, latency}},
		// Half the time each: neither unit is the workload's bottleneck,
		// though the means make it compute-bound.
		{"compute and memory tie", []launch{{vectorAdd, 1, 100_000, 33.4, 82.0}, {fmaLoop, 1, 100_000, 97.3, 0.37}},
			class{balanced, shares{MemoryBoundMilliPercent: 50_000, ComputeBoundMilliPercent: 50_000}, 65_350, 41_185, compute}},
		// Half the time latency-bound: the memory-bound half decides.
		{"memory and latency tie", []launch{{vectorAdd, 1, 100_000, 33.4, 82.0}, {tiny, 4, 25_000, 0.2, 11.5}},
			class{memory, shares{MemoryBoundMilliPercent: 50_000, LatencyBoundMilliPercent: 50_000}, 16_800, 46_750, latency}},
		// No launch has a duration: the shares and means are of launches,
		// (3*33.4 + 97.3) / 4 = 49.375 % SM, (3*82.0 + 0.37) / 4 = 61.5925 % memory.
		{"zero durations", []launch{{vectorAdd, 3, 0, 33.4, 82.0}, {fmaLoop, 1, 0, 97.3, 0.37}},
			class{memory, shares{MemoryBoundMilliPercent: 75_000, ComputeBoundMilliPercent: 25_000}, 49_375, 61_593, memory}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, err := FromReport(context.Background(), strings.NewReader(rawReport(tc.launches...)), Options{ObservedAt: observedAt})
			if err != nil {
				t.Fatal(err)
			}
			if st.BoundTimeShares == nil || st.SMThroughputMilliPercent == nil || st.MemoryThroughputMilliPercent == nil {
				t.Fatalf("status lacks the shares or the throughputs: %+v", st)
			}
			got := class{
				Bound: st.BoundType, Shares: *st.BoundTimeShares,
				SM: *st.SMThroughputMilliPercent, Memory: *st.MemoryThroughputMilliPercent,
				Averaged: Classify(*st.SMThroughputMilliPercent, *st.MemoryThroughputMilliPercent),
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("class (-want +got):\n%s", diff)
			}
			checkReclassifies(t, st)
			// The message says where the time went when it is split.
			c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProfiled)
			if split := describeShares(*st.BoundTimeShares); c == nil || (split != "") != strings.Contains(c.Message, "GPU time by class: "+split) {
				t.Errorf("Profiled condition %+v does not say the shares %q", c, split)
			}
		})
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
