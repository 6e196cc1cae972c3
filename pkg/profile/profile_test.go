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
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/google/go-cmp/cmp"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/goldentest"
)

var observedAt = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-80GB"
)

func ptr(v int32) *int32 { return &v }

// allOf is the shares of a workload whose GPU time is all in class b.
func allOf(b v1alpha1.BoundType) *v1alpha1.BoundTimeShares {
	s := &v1alpha1.BoundTimeShares{}
	switch b {
	case v1alpha1.BoundTypeComputeBound:
		s.ComputeBoundMilliPercent = 100_000
	case v1alpha1.BoundTypeMemoryBound:
		s.MemoryBoundMilliPercent = 100_000
	case v1alpha1.BoundTypeLatencyBound:
		s.LatencyBoundMilliPercent = 100_000
	case v1alpha1.BoundTypeBalanced:
		s.BalancedMilliPercent = 100_000
	}
	return s
}

// TestFromReportGolden checks the classification and the aggregates of each
// fixture by hand-computed values, then the whole status against a golden
// file, so that a change to any field is seen in review.
func TestFromReportGolden(t *testing.T) {
	type want struct {
		Bound                 v1alpha1.BoundType
		Shares                *v1alpha1.BoundTimeShares
		Sm, Memory, Dram, Occ *int32
		Waves                 string
		Launches              int32
		GpuTime               int64
		Flops, DramBytes, Ai  string
		// Shown is what kubectl's columns print: SM, memory, occupancy.
		Shown                               [3]string
		Roofline                            metav1.ConditionStatus
		RooflineReason                      string
		Top                                 []v1alpha1.KernelSummary
		Version, Product, ComputeCapability string
	}
	const (
		vectorAdd = "vectorAdd(const float *, const float *, float *, int)"
		fmaLoop   = "fmaLoop(const float *, float *)"
		tiny      = "tinyKernel(const float *, float *)"
	)
	// product is what the caller says the device is (the kubelet plugin
	// knows it from NVML); "" leaves it to the report. The raw page names
	// the product, the details page only the device's index.
	tests := []struct {
		file    string
		product string
		want    want
	}{{
		file: "vectoradd_raw.csv", product: "",
		want: want{
			Shown: [3]string{"33.6%", "82.3%", "76.5%"},
			Bound: v1alpha1.BoundTypeMemoryBound, Shares: allOf(v1alpha1.BoundTypeMemoryBound), Sm: ptr(33_550), Memory: ptr(82_280), Dram: ptr(82_280), Occ: ptr(76_460),
			Waves: "248240m", Launches: 1, GpuTime: 288_352,
			// 67108864 FADD over 795293440 bytes: 0.0844 FLOP/byte, far below H100's ridge of 20
			Flops: "67108864", DramBytes: "795293440", Ai: "84m",
			Roofline: metav1.ConditionTrue, RooflineReason: v1alpha1.ReasonRooflineAgrees,
			Top:     []v1alpha1.KernelSummary{{Name: vectorAdd, Launches: 1, TimeShareMilliPercent: 100_000, SMThroughputMilliPercent: 33_550, MemoryThroughputMilliPercent: 82_280}},
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		file: "vectoradd_details.csv", product: h100,
		want: want{
			Shown: [3]string{"33.4%", "82.0%", "76.5%"},
			Bound: v1alpha1.BoundTypeMemoryBound, Shares: allOf(v1alpha1.BoundTypeMemoryBound), Sm: ptr(33_440), Memory: ptr(82_040), Dram: ptr(82_040), Occ: ptr(76_480),
			Waves: "248240m", Launches: 1, GpuTime: 289_184,
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		file: "fmaloop_raw.csv", product: "",
		want: want{
			Shown: [3]string{"97.4%", "0.4%", "60.7%"},
			Bound: v1alpha1.BoundTypeComputeBound, Shares: allOf(v1alpha1.BoundTypeComputeBound), Sm: ptr(97_370), Memory: ptr(400), Dram: ptr(230), Occ: ptr(60_710),
			Waves: "1", Launches: 1, GpuTime: 140_832,
			// 4325376 FADD + 2 * 4429185024 FFMA over 1086464 bytes
			Flops: "8862695424", DramBytes: "1086464", Ai: "8157376m",
			Roofline: metav1.ConditionTrue, RooflineReason: v1alpha1.ReasonRooflineAgrees,
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		file: "fmaloop_details.csv", product: h100,
		want: want{
			Shown: [3]string{"97.4%", "0.4%", "60.7%"},
			Bound: v1alpha1.BoundTypeComputeBound, Shares: allOf(v1alpha1.BoundTypeComputeBound), Sm: ptr(97_390), Memory: ptr(370), Dram: ptr(290), Occ: ptr(60_710),
			Waves: "1", Launches: 1, GpuTime: 140_704,
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		file: "tinygrid_raw.csv", product: "",
		want: want{
			Shown: [3]string{"0.2%", "11.5%", "3.1%"},
			Bound: v1alpha1.BoundTypeLatencyBound, Shares: allOf(v1alpha1.BoundTypeLatencyBound), Sm: ptr(180), Memory: ptr(11_530), Dram: ptr(130), Occ: ptr(3_120),
			Waves: "10m", Launches: 1, GpuTime: 2_784,
			// 2 * 131072 FFMA over 12032 bytes; a latency-bound report
			// gets no roofline verdict.
			Flops: "262144", DramBytes: "12032", Ai: "21787m",
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		file: "tinygrid_details.csv", product: h100,
		want: want{
			Shown: [3]string{"0.2%", "11.7%", "3.1%"},
			Bound: v1alpha1.BoundTypeLatencyBound, Shares: allOf(v1alpha1.BoundTypeLatencyBound), Sm: ptr(180), Memory: ptr(11_700), Dram: ptr(130), Occ: ptr(3_120),
			Waves: "10m", Launches: 1, GpuTime: 2_784,
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		// Weighted by duration over 731840 ns: vectorAdd 289280 + 289184,
		// fmaLoop 141216, tinyKernel 3136 + 2816 + 3168 + 3040.
		file: "mixed_raw.csv", product: "",
		want: want{
			Shown: [3]string{"45.2%", "65.1%", "72.2%"},
			// Each kernel on its own: vectorAdd MemoryBound (memory 82.0 %
			// is at least 80), fmaLoop ComputeBound, tinyKernel
			// LatencyBound; their shares of the time are those of the top
			// kernels below.
			Bound:  v1alpha1.BoundTypeMemoryBound,
			Shares: &v1alpha1.BoundTimeShares{MemoryBoundMilliPercent: 79_042, ComputeBoundMilliPercent: 19_296, LatencyBoundMilliPercent: 1_662},
			// (33.36*289280 + 33.41*289184 + 97.27*141216 + 0.16*3136 + 0.17*2816 + 0.15*3168 + 0.16*3040) / 731840 = 45.1602
			Sm: ptr(45_160),
			// (82.00*289280 + 82.03*289184 + 0.37*141216 + 10.23*3136 + 11.33*2816 + 10.15*3168 + 10.48*3040) / 731840 = 65.0729
			Memory: ptr(65_073),
			// (82.00*289280 + 82.03*289184 + 0.28*141216 + 0.11*3136 + 0.13*2816 + 0.11*3168 + 0.12*3040) / 731840 = 64.8826
			Dram: ptr(64_883),
			// (76.43*289280 + 76.46*289184 + 60.81*141216 + 3.12*12160) / 731840 = 72.2097
			Occ: ptr(72_210),
			// (248.24*578464 + 1*141216 + 0.01*12160) / 731840 = 196.4080
			Waves: "196408m", Launches: 7, GpuTime: 731_840,
			// 2*67108864 + (4325376 + 2*4429185024) + 4*2*131072 FLOPs over
			// 795256576 + 795142656 + 1348608 + 11776 + 12032 + 12032 + 11776 bytes
			Flops: "8997961728", DramBytes: "1591795456", Ai: "5653m",
			Roofline: metav1.ConditionTrue, RooflineReason: v1alpha1.ReasonRooflineAgrees,
			Top: []v1alpha1.KernelSummary{
				// 578464 ns: (33.36*289280 + 33.41*289184) / 578464 = 33.3850
				{Name: vectorAdd, Launches: 2, TimeShareMilliPercent: 79_042, SMThroughputMilliPercent: 33_385, MemoryThroughputMilliPercent: 82_015},
				{Name: fmaLoop, Launches: 1, TimeShareMilliPercent: 19_296, SMThroughputMilliPercent: 97_270, MemoryThroughputMilliPercent: 370},
				// 12160 ns: (10.23*3136 + 11.33*2816 + 10.15*3168 + 10.48*3040) / 12160 = 10.5264
				{Name: tiny, Launches: 4, TimeShareMilliPercent: 1_662, SMThroughputMilliPercent: 160, MemoryThroughputMilliPercent: 10_526},
			},
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		// Hand-written. Weighted by duration: 2 ms of vectorAdd, 0.2 ms of
		// fmaLoop, 15 us of tinyKernel; the n/a launch is left out.
		file: "legacy-metric-names_raw.csv", product: a100,
		want: want{
			Shown: [3]string{"26.2%", "82.2%", "80.9%"},
			Bound: v1alpha1.BoundTypeMemoryBound,
			// vectorAdd MemoryBound, fmaLoop ComputeBound, tinyKernel
			// LatencyBound, with the top kernels' shares of the time.
			Shares: &v1alpha1.BoundTimeShares{MemoryBoundMilliPercent: 90_293, ComputeBoundMilliPercent: 9_029, LatencyBoundMilliPercent: 677},
			Sm:     ptr(26_205), // (20*2e6 + 90*2e5 + 3*1.5e4) / 2.215e6 = 26.2054
			Memory: ptr(82_181), // (90*2e6 + 10*2e5 + 2*1.5e4) / 2.215e6 = 82.1806
			// vectorAdd #2 has no DRAM figure: (88*1e6 + 1*2e5 + 0.5*1.5e4) / 1.215e6 = 72.5988
			Dram: ptr(72_599),
			Occ:  ptr(80_853), // (80*2e6 + 95*2e5 + 6*1.5e4) / 2.215e6 = 80.8533
			// (229.1*2e6 + 1*2e5 + 0.01*1.5e4) / 2.215e6 = 206.9532
			Waves: "206953m", Launches: 6, GpuTime: 2_215_000,
			Top: []v1alpha1.KernelSummary{
				{Name: vectorAdd, Launches: 2, TimeShareMilliPercent: 90_293, SMThroughputMilliPercent: 20_000, MemoryThroughputMilliPercent: 90_000},
				{Name: "fmaLoop(float *, int)", Launches: 1, TimeShareMilliPercent: 9_029, SMThroughputMilliPercent: 90_000, MemoryThroughputMilliPercent: 10_000},
				{Name: "tinyKernel(float *)", Launches: 3, TimeShareMilliPercent: 677, SMThroughputMilliPercent: 3_000, MemoryThroughputMilliPercent: 2_000},
			},
			Version: "2025.2.1.0", Product: a100, ComputeCapability: "8.0",
		},
	}, {
		// Hand-written: FP32 work per elapsed cycle.
		file: "per-cycle-fp32_raw.csv", product: h100,
		want: want{
			Shown: [3]string{"3.2%", "1.9%", "6.2%"},
			Bound: v1alpha1.BoundTypeLatencyBound, Shares: allOf(v1alpha1.BoundTypeLatencyBound), Sm: ptr(3_210), Memory: ptr(1_870), Dram: ptr(420), Occ: ptr(6_180),
			Waves: "10m", Launches: 1, GpuTime: 4_256,
			// (0.3026 + 2*19.3691) inst/cycle * 1.59 GHz * 4256 ns
			Flops: "264191", DramBytes: "16380", Ai: "16129m",
			Product: h100, ComputeCapability: "9.0",
		},
	}, {
		// Hand-written: DRAM bytes from the Memory Workload Analysis rate.
		file: "dram-rate_details.csv", product: h100,
		want: want{
			Shown: [3]string{"20.4%", "90.1%", "82.3%"},
			Bound: v1alpha1.BoundTypeMemoryBound, Shares: allOf(v1alpha1.BoundTypeMemoryBound), Sm: ptr(20_410), Memory: ptr(90_120), Dram: ptr(90_120), Occ: ptr(82_310),
			Waves: "992970m", Launches: 1, GpuTime: 1_070_000,
			DramBytes: "3220700k", // 3.01 Tbyte/s for 1.07 ms
			Product:   h100, ComputeCapability: "9.0",
		},
	}}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("..", "ncu", "testdata", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			st, err := FromReport(context.Background(), f, Options{
				Device:     v1alpha1.ProfiledDevice{ProductName: tc.product},
				Source:     &v1alpha1.ProfileSource{Type: v1alpha1.ProfileSourceImport},
				ObservedAt: observedAt,
			})
			if err != nil {
				t.Fatal(err)
			}
			w := tc.want
			got := want{
				Bound: st.BoundType, Shares: st.BoundTimeShares, Sm: st.SMThroughputMilliPercent, Memory: st.MemoryThroughputMilliPercent,
				Dram: st.DRAMThroughputMilliPercent, Occ: st.AchievedOccupancyMilliPercent,
				Waves: qty(st.WavesPerSM), Launches: st.KernelLaunches, GpuTime: st.TotalGPUTimeNanoseconds,
				Flops: qty(st.FLOPs), DramBytes: qty(st.DRAMBytes), Ai: qty(st.ArithmeticIntensity),
				Version: st.NCUVersion, Product: st.Device.ProductName, ComputeCapability: st.Device.ComputeCapability,
				Shown: [3]string{st.SMThroughput, st.MemoryThroughput, st.AchievedOccupancy},
			}
			if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRooflineConsistent); c != nil {
				got.Roofline, got.RooflineReason = c.Status, c.Reason
			}
			if w.Top != nil {
				got.Top = st.TopKernels
			}
			if diff := cmp.Diff(w, got); diff != "" {
				t.Errorf("status differs (-want +got):\n%s", diff)
			}
			if !meta.IsStatusConditionTrue(st.Conditions, v1alpha1.ConditionProfiled) {
				t.Errorf("Profiled is not True: %+v", st.Conditions)
			}
			checkReclassifies(t, st)
			golden, err := yaml.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			goldentest.Compare(t, filepath.Join("testdata", strings.TrimSuffix(tc.file, ".csv")+".golden.yaml"), golden)
		})
	}
}

// checkReclassifies holds a status to the package's invariant: anyone can
// recompute the stored class from what the status stores. The workload's
// class comes from its stored shares of GPU time, and each top kernel's
// class from its stored throughputs; a class that holds no time is not
// the class of any kernel.
func checkReclassifies(t *testing.T, st v1alpha1.WorkloadProfileStatus) {
	t.Helper()
	if st.BoundTimeShares == nil {
		t.Fatalf("no boundTimeShares in a status of %d launches", st.KernelLaunches)
	}
	if c := ClassifyShares(*st.BoundTimeShares); c != st.BoundType {
		t.Errorf("ClassifyShares of the stored shares %+v = %s, status says %s", *st.BoundTimeShares, c, st.BoundType)
	}
	held := map[v1alpha1.BoundType]int32{
		v1alpha1.BoundTypeComputeBound: st.BoundTimeShares.ComputeBoundMilliPercent,
		v1alpha1.BoundTypeMemoryBound:  st.BoundTimeShares.MemoryBoundMilliPercent,
		v1alpha1.BoundTypeLatencyBound: st.BoundTimeShares.LatencyBoundMilliPercent,
		v1alpha1.BoundTypeBalanced:     st.BoundTimeShares.BalancedMilliPercent,
	}
	for _, k := range st.TopKernels {
		if c := Classify(k.SMThroughputMilliPercent, k.MemoryThroughputMilliPercent); k.TimeShareMilliPercent > 0 && held[c] < k.TimeShareMilliPercent {
			t.Errorf("top kernel %s is %s with %d milli-percent of the time, but the status gives %s only %d", k.Name, c, k.TimeShareMilliPercent, c, held[c])
		}
	}
}

func asJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func qty(q *resource.Quantity) string {
	if q == nil {
		return ""
	}
	return q.String()
}

func TestSummarizeLatencyMessage(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "ncu", "testdata", "tinygrid_details.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := FromReport(context.Background(), f, Options{ObservedAt: observedAt, NCUVersion: "2025.3.1.0"})
	if err != nil {
		t.Fatal(err)
	}
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProfiled)
	if c == nil || !strings.Contains(c.Message, "0.01 waves per SM") {
		t.Errorf("Profiled condition %+v does not explain the partial wave", c)
	}
	if st.NCUVersion != "2025.3.1.0" {
		t.Errorf("ncu version %q, want the caller's", st.NCUVersion)
	}
	// The details page names no product, only the device's index, so the
	// roofline cannot be placed.
	if st.Device.ProductName != "" {
		t.Errorf("product %q from a device index", st.Device.ProductName)
	}
}

func TestFromReportEmptyAndBroken(t *testing.T) {
	empty := `"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"` + "\n"
	st, err := FromReport(context.Background(), strings.NewReader(empty), Options{ObservedAt: observedAt})
	if err != nil {
		t.Fatal(err)
	}
	if st.BoundType != v1alpha1.BoundTypeUnknown || st.SMThroughputMilliPercent != nil || st.Device != nil {
		t.Errorf("empty report gave %+v, want Unknown and no numbers", st)
	}
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProfiled); c == nil || c.Status != metav1.ConditionFalse || c.Reason != v1alpha1.ReasonNoKernels {
		t.Errorf("Profiled = %+v, want False/NoKernels", c)
	}

	_, err = FromReport(context.Background(), strings.NewReader("==PROF== nothing\n"), Options{})
	if err == nil || !strings.Contains(err.Error(), "parsing ncu report") {
		t.Errorf("err = %v, want a parse error", err)
	}
}

func TestApply(t *testing.T) {
	before := metav1.NewTime(observedAt.Add(-time.Hour))
	wp := &v1alpha1.WorkloadProfile{
		ObjectMeta: metav1.ObjectMeta{Name: "w", Generation: 3},
		Spec:       v1alpha1.WorkloadProfileSpec{DisableAutoProfiling: true},
		Status: v1alpha1.WorkloadProfileStatus{
			BoundType:  v1alpha1.BoundTypeComputeBound,
			FLOPs:      resource.NewQuantity(5, resource.DecimalSI),
			TopKernels: []v1alpha1.KernelSummary{{Name: "old", Launches: 1}},
			Conditions: []metav1.Condition{
				{Type: v1alpha1.ConditionProfiled, Status: metav1.ConditionTrue, Reason: "Old", LastTransitionTime: before, ObservedGeneration: 1},
				{Type: v1alpha1.ConditionRooflineConsistent, Status: metav1.ConditionTrue, Reason: "Old", LastTransitionTime: before},
			},
		},
	}
	now := metav1.NewTime(observedAt)
	st := v1alpha1.WorkloadProfileStatus{
		BoundType: v1alpha1.BoundTypeMemoryBound,
		Conditions: []metav1.Condition{
			{Type: v1alpha1.ConditionProfiled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReportParsed, LastTransitionTime: now},
		},
	}
	Apply(wp, st)
	if wp.Status.BoundType != v1alpha1.BoundTypeMemoryBound || wp.Status.FLOPs != nil || wp.Status.TopKernels != nil {
		t.Errorf("measured fields not replaced: %+v", wp.Status)
	}
	if !wp.Spec.DisableAutoProfiling {
		t.Errorf("spec changed")
	}
	p := meta.FindStatusCondition(wp.Status.Conditions, v1alpha1.ConditionProfiled)
	if !p.LastTransitionTime.Equal(&before) || p.Reason != v1alpha1.ReasonReportParsed || p.ObservedGeneration != 3 {
		t.Errorf("Profiled = %+v, want the old transition time, the new reason and generation 3", p)
	}
	// The new report gave the roofline nothing to judge: the old verdict
	// was about another run and must go.
	if r := meta.FindStatusCondition(wp.Status.Conditions, v1alpha1.ConditionRooflineConsistent); r != nil {
		t.Errorf("RooflineConsistent = %+v, want it removed", r)
	}
	// Apply must not alias the caller's status.
	st.Conditions[0].Reason = "Mutated"
	if p.Reason == "Mutated" {
		t.Errorf("Apply aliased the caller's conditions")
	}
}

func TestToMilliPercent(t *testing.T) {
	tests := map[float64]int32{0: 0, 87.5: 87_500, 20.4104: 20_410, 20.4105: 20_411, 100.3: 100_000, -1: 0, math.SmallestNonzeroFloat64: 0}
	for in, want := range tests {
		if got := toMilliPercent(in); got != want {
			t.Errorf("toMilliPercent(%v) = %d, want %d", in, got, want)
		}
	}
	if got := FormatMilliPercent(87_500); got != "87.5%" {
		t.Errorf("FormatMilliPercent(87500) = %q", got)
	}
}

func TestTruncateKeepsUTF8(t *testing.T) {
	s := strings.Repeat("a", maxKernelName-1) + "é"
	got := Truncate(s, maxKernelName)
	if len(got) != maxKernelName-1 || !strings.HasPrefix(s, got) {
		t.Errorf("Truncate split a rune: len %d", len(got))
	}
}

// TestFormatPercent: kubectl's columns show what a person reads, to one
// decimal, next to the milli-percent integers kept for programs.
func TestFormatPercent(t *testing.T) {
	tests := []struct {
		milli *int32
		want  string
	}{
		{nil, ""},
		{ptr(0), "0.0%"},
		{ptr(20_923), "20.9%"},
		{ptr(87_550), "87.6%"},
		{ptr(99_960), "100.0%"},
		{ptr(100_000), "100.0%"},
		{ptr(49), "0.0%"},
		{ptr(50), "0.1%"},
	}
	for _, tc := range tests {
		if got := formatPercent(tc.milli); got != tc.want {
			t.Errorf("formatPercent(%v) = %q, want %q", tc.milli, got, tc.want)
		}
	}
}
