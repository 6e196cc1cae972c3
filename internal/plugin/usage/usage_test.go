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

package usage

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
)

const gi = int64(1) << 30

// run adds one sample per duty cycle, each holding memory bytes, with SM
// activity sm (Unknown for none).
func run(memory int64, sm float64, duty ...int) Run {
	var r Run
	for _, d := range duty {
		r.Add(Sample{DutyCyclePercent: d, MemoryBytes: memory, SMActivityPercent: sm, DRAMActivityPercent: Unknown})
	}
	return r
}

func TestPercentiles(t *testing.T) {
	// 0, 5, ..., 95: twenty samples. Nearest rank: p50 is the 10th (45),
	// p95 the 19th (90), p100 the 20th (95).
	var twenty []int
	for d := 0; d < 100; d += 5 {
		twenty = append(twenty, d)
	}
	for _, tc := range []struct {
		name string
		run  Run
		p    float64
		want int
		ok   bool
	}{
		{"median of twenty", run(0, Unknown, twenty...), 50, 45, true},
		{"p95 of twenty", run(0, Unknown, twenty...), 95, 90, true},
		{"p100 of twenty", run(0, Unknown, twenty...), 100, 95, true},
		{"p95 of three", run(0, Unknown, 40, 40, 60), 95, 60, true},
		{"median of three", run(0, Unknown, 40, 40, 60), 50, 40, true},
		{"clamped above 100", run(0, Unknown, 130, 130, 130), 50, 100, true},
		{"clamped below 0", run(0, Unknown, -5, -5), 50, 0, true},
		{"no samples", Run{}, 50, 0, false},
		{"unknown duty cycles are not samples", run(0, Unknown, Unknown, Unknown), 50, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := tc.run.DutyCyclePercentile(tc.p)
			if got != tc.want || ok != tc.ok {
				t.Errorf("DutyCyclePercentile(%v) = %d, %v; want %d, %v", tc.p, got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestRunKeepsPeakAndMeans(t *testing.T) {
	var r Run
	r.Add(Sample{DutyCyclePercent: 10, MemoryBytes: 2 * gi, SMActivityPercent: 20, DRAMActivityPercent: Unknown})
	r.Add(Sample{DutyCyclePercent: 30, MemoryBytes: 5 * gi, SMActivityPercent: 40, DRAMActivityPercent: 10})
	r.Add(Sample{DutyCyclePercent: Unknown, MemoryBytes: 3 * gi, SMActivityPercent: Unknown, DRAMActivityPercent: Unknown})
	sm, smOK := r.SMActivityMean()
	dram, dramOK := r.DRAMActivityMean()
	got := []any{r.Samples(), r.MemorySamples, r.PeakMemoryBytes, sm, smOK, dram, dramOK}
	want := []any{int32(2), int32(3), 5 * gi, 30.0, true, 10.0, true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("samples, memory samples, peak, SM mean, DRAM mean (-want +got):\n%s", diff)
	}
}

// TestMergeOfThreeRuns works three runs through by hand:
//
//	run  p50  p95  peak  SM
//	1    40   60   4Gi   30
//	2    20   40   2Gi   (no GPM)
//	3    30   50   3Gi   50
//
// After run 1 the profile is run 1. After run 2: p50 (40+20)/2 = 30, p95
// (60+40)/2 = 50, peak max(2Gi, (4Gi+2Gi)/2) = 3Gi, SM keeps 30. After run
// 3: p50 (30+30)/2 = 30, p95 (50+50)/2 = 50, peak max(3Gi, 3Gi) = 3Gi, SM
// (30+50)/2 = 40.
func TestMergeOfThreeRuns(t *testing.T) {
	end := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	runs := []Finished{
		{Run: run(4*gi, 30, 40, 40, 60), ProductName: "NVIDIA H100 80GB HBM3", EndedAt: end},
		{Run: run(2*gi, Unknown, 20, 20, 40), ProductName: "NVIDIA H100 80GB HBM3", EndedAt: end.Add(time.Hour)},
		{Run: run(3*gi, 50, 30, 30, 50), ProductName: "NVIDIA A100-SXM4-40GB", EndedAt: end.Add(2 * time.Hour), Share: &gpuv1alpha1.Share{ComputePercent: 60, MemoryBytes: 8 * gi}},
	}
	want := []*prismv1alpha1.UsageProfile{{
		DutyCycleP50MilliPercent: ptr.To[int32](40000), DutyCycleP95MilliPercent: ptr.To[int32](60000),
		SMActivityMilliPercent: ptr.To[int32](30000), PeakMemory: resource.NewQuantity(4*gi, resource.BinarySI),
		Samples: 3, Runs: 1, ProductName: "NVIDIA H100 80GB HBM3", ObservedAt: ptr.To(metav1.NewTime(end)),
	}, {
		DutyCycleP50MilliPercent: ptr.To[int32](30000), DutyCycleP95MilliPercent: ptr.To[int32](50000),
		SMActivityMilliPercent: ptr.To[int32](30000), PeakMemory: resource.NewQuantity(3*gi, resource.BinarySI),
		Samples: 3, Runs: 2, ProductName: "NVIDIA H100 80GB HBM3", ObservedAt: ptr.To(metav1.NewTime(end.Add(time.Hour))),
	}, {
		DutyCycleP50MilliPercent: ptr.To[int32](30000), DutyCycleP95MilliPercent: ptr.To[int32](50000),
		SMActivityMilliPercent: ptr.To[int32](40000), PeakMemory: resource.NewQuantity(3*gi, resource.BinarySI),
		Samples: 3, Runs: 3, ProductName: "NVIDIA A100-SXM4-40GB", ObservedAt: ptr.To(metav1.NewTime(end.Add(2 * time.Hour))),
		Share: &prismv1alpha1.GrantedShare{ComputePercent: 60, Memory: resource.NewQuantity(8*gi, resource.BinarySI)},
	}}
	var profile *prismv1alpha1.UsageProfile
	for i, f := range runs {
		before := profile.DeepCopy()
		profile = Merge(t.Context(), profile, f)
		if diff := cmp.Diff(want[i], profile); diff != "" {
			t.Errorf("after run %d (-want +got):\n%s", i+1, diff)
		}
		if i > 0 && !cmp.Equal(before, want[i-1]) {
			t.Errorf("merging run %d changed the previous usage", i+1)
		}
	}
}

func TestGrowingRunIsNotSizedBelowItsPeak(t *testing.T) {
	prev := Merge(t.Context(), nil, Finished{Run: run(2*gi, Unknown, 10, 10, 10)})
	got := Merge(t.Context(), prev, Finished{Run: run(10*gi, Unknown, 10, 10, 10)})
	if want := resource.NewQuantity(10*gi, resource.BinarySI); got.PeakMemory.Cmp(*want) != 0 {
		t.Errorf("peak memory %s after a run that held %s; want the newest peak", got.PeakMemory, want)
	}
}

// TestPreviousPeakIsBounded: a previous peak memory that no GPU could have
// held, or that is not a byte count, is left out of the merge with a logged
// reason, and the run's own peak is the profile's; one up to
// MaxPeakMemoryBytes is averaged in without overflowing. Unbounded, 1Ei
// became a peak of 512Pi and MaxInt64 overflowed the mean and vanished.
func TestPreviousPeakIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name     string
		previous resource.Quantity
		want     resource.Quantity
		// dropped is whether the previous peak is left out and logged.
		dropped bool
	}{
		{name: "normal", previous: resource.MustParse("4Gi"), want: *resource.NewQuantity(3*gi, resource.BinarySI)},
		{name: "zero", previous: resource.MustParse("0"), want: *resource.NewQuantity(2*gi, resource.BinarySI)},
		{name: "at the bound", previous: *resource.NewQuantity(MaxPeakMemoryBytes, resource.BinarySI),
			want: *resource.NewQuantity(MaxPeakMemoryBytes/2+gi, resource.BinarySI)},
		{name: "a byte above the bound", previous: *resource.NewQuantity(MaxPeakMemoryBytes+1, resource.BinarySI),
			want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
		{name: "1Ei", previous: resource.MustParse("1Ei"), want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
		{name: "MaxInt64", previous: *resource.NewQuantity(math.MaxInt64, resource.BinarySI),
			want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
		{name: "beyond int64", previous: resource.MustParse("100Ei"), want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
		{name: "negative", previous: resource.MustParse("-4Gi"), want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
		{name: "garbage: a fraction of a byte", previous: resource.MustParse("1500m"), want: *resource.NewQuantity(2*gi, resource.BinarySI), dropped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(t.Context(), logger)
			prev := Merge(ctx, nil, Finished{Run: run(gi, Unknown, 10, 10, 10)})
			prev.PeakMemory = ptr.To(tc.previous)
			got := Merge(ctx, prev, Finished{Run: run(2*gi, Unknown, 10, 10, 10)})
			if diff := cmp.Diff(tc.want, *got.PeakMemory); diff != "" {
				t.Errorf("peak memory after a run that held 2Gi (-want +got):\n%s", diff)
			}
			var logged []any
			for _, e := range logger.GetSink().(ktesting.Underlier).GetBuffer().Data() {
				if e.Verbosity == 0 && e.Message == "Leaving the profile's previous peak memory out of the merge" {
					logged = append(logged, e.ParameterKVList[1])
				}
			}
			var want []any
			if tc.dropped {
				want = []any{tc.previous.String()}
			}
			if diff := cmp.Diff(want, logged); diff != "" {
				t.Errorf("previous peaks logged as left out (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMaxPeakMemoryIsAboveEveryGPU: the bound on a previous peak keeps a
// margin of at least 16 times the memory of every GPU in the spec table, so
// that no real reading is ever left out.
func TestMaxPeakMemoryIsAboveEveryGPU(t *testing.T) {
	for _, product := range gpu.Products() {
		spec, _ := gpu.LookupSpec(product)
		if spec.MemoryBytes() > MaxPeakMemoryBytes/16 {
			t.Errorf("%s holds %s, within 16 times of MaxPeakMemoryBytes (%s)", product,
				resource.NewQuantity(int64(spec.MemoryBytes()), resource.BinarySI), resource.NewQuantity(MaxPeakMemoryBytes, resource.BinarySI))
		}
	}
}

func TestShortRunIsNotMerged(t *testing.T) {
	prev := Merge(t.Context(), nil, Finished{Run: run(gi, Unknown, 10, 10, 10)})
	if got := Merge(t.Context(), prev, Finished{Run: run(gi, Unknown, 90, 90)}); got != nil {
		t.Errorf("a run of 2 samples was merged: %+v", got)
	}
}

func TestProfileWithoutRunsIsNotAveraged(t *testing.T) {
	// A status.usage someone wrote by hand without runs is replaced, not
	// averaged with.
	prev := &prismv1alpha1.UsageProfile{DutyCycleP50MilliPercent: ptr.To[int32](90000)}
	got := Merge(t.Context(), prev, Finished{Run: run(gi, Unknown, 10, 10, 10)})
	if *got.DutyCycleP50MilliPercent != 10000 || got.Runs != 1 {
		t.Errorf("p50 %d over %d runs, want 10000 over 1", *got.DutyCycleP50MilliPercent, got.Runs)
	}
}

func TestExceeded(t *testing.T) {
	memory := prismv1alpha1.ShareResourceMemory
	compute := prismv1alpha1.ShareResourceCompute
	for _, tc := range []struct {
		name  string
		run   Run
		share *gpuv1alpha1.Share
		want  *prismv1alpha1.ShareExceeded
	}{
		{"whole GPU", run(80*gi, Unknown, 100, 100, 100), nil, nil},
		{"within both", run(7*gi, Unknown, 30, 30, 44), &gpuv1alpha1.Share{ComputePercent: 50, MemoryBytes: 8 * gi}, nil},
		{"memory above its share", run(9*gi, Unknown, 30, 30, 30), &gpuv1alpha1.Share{ComputePercent: 50, MemoryBytes: 8 * gi},
			&prismv1alpha1.ShareExceeded{Resources: []prismv1alpha1.ShareResource{memory}, Message: "peak memory 9Gi above its share of 8Gi"}},
		{"memory exactly its share", run(8*gi, Unknown, 30, 30, 30), &gpuv1alpha1.Share{ComputePercent: 50, MemoryBytes: 8 * gi}, nil},
		{"p95 within 5 points of the compute share", run(gi, Unknown, 30, 30, 45), &gpuv1alpha1.Share{ComputePercent: 50, MemoryBytes: 8 * gi},
			&prismv1alpha1.ShareExceeded{Resources: []prismv1alpha1.ShareResource{compute}, Message: "duty cycle p95 45% at its compute cap of 50%"}},
		{"p95 past an unenforced compute share", run(gi, Unknown, 100, 100, 100), &gpuv1alpha1.Share{ComputePercent: 30},
			&prismv1alpha1.ShareExceeded{Resources: []prismv1alpha1.ShareResource{compute}, Message: "duty cycle p95 100% at its compute cap of 30%"}},
		{"a whole GPU's compute is never pinned", run(gi, Unknown, 100, 100, 100), &gpuv1alpha1.Share{ComputePercent: 100, MemoryBytes: 8 * gi}, nil},
		{"memory share only", run(gi, Unknown, 100, 100, 100), &gpuv1alpha1.Share{MemoryBytes: 8 * gi}, nil},
		{"both", run(9*gi, Unknown, 50, 50, 50), &gpuv1alpha1.Share{ComputePercent: 50, MemoryBytes: 8 * gi},
			&prismv1alpha1.ShareExceeded{Resources: []prismv1alpha1.ShareResource{memory, compute},
				Message: "peak memory 9Gi above its share of 8Gi; duty cycle p95 50% at its compute cap of 50%"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Exceeded(tc.run, tc.share)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
