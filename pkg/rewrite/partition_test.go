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
	"encoding/json"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// migModel is a GPU model in MIG mode as the fleet view sees it: the whole
// GPUs, and the partitions the kubelet plugin publishes for them, with the
// figures of pkg/gpu/nvml's simulated MIG tables (the H100's match
// testdata/real/nvidia-h100-80gb-hbm3.mig.json).
func migModel(name string, gpus int, whole Model, profiles ...PartitionModel) (Model, []PartitionModel) {
	whole.Name, whole.Devices = name, gpus
	out := make([]PartitionModel, len(profiles))
	for i, p := range profiles {
		p.Model = name
		p.Devices *= gpus
		out[i] = p
	}
	return whole, out
}

func mib(n int64) int64 { return n << 20 }

var (
	h100Whole, h100Partitions = migModel("NVIDIA H100 80GB HBM3", 2,
		Model{BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: mib(81559), Multiprocessors: 132},
		PartitionModel{Profile: "1g.10gb", Devices: 7, MemoryBytes: mib(9984), Multiprocessors: 16},
		PartitionModel{Profile: "1g.10gb+me", Devices: 7, MemoryBytes: mib(9984), Multiprocessors: 16},
		PartitionModel{Profile: "1g.20gb", Devices: 4, MemoryBytes: mib(20096), Multiprocessors: 26},
		PartitionModel{Profile: "2g.20gb", Devices: 3, MemoryBytes: mib(20096), Multiprocessors: 32},
		PartitionModel{Profile: "3g.40gb", Devices: 2, MemoryBytes: mib(40448), Multiprocessors: 60},
		PartitionModel{Profile: "4g.40gb", Devices: 1, MemoryBytes: mib(40448), Multiprocessors: 64},
		PartitionModel{Profile: "7g.80gb", Devices: 1, MemoryBytes: mib(81152), Multiprocessors: 132})
	a100Whole, a100Partitions = migModel("NVIDIA A100-SXM4-40GB", 2,
		Model{BandwidthGBps: 1555, FP32GFLOPS: 19500, MemoryBytes: mib(40960), Multiprocessors: 108},
		PartitionModel{Profile: "1g.5gb", Devices: 7, MemoryBytes: mib(4864), Multiprocessors: 14},
		PartitionModel{Profile: "1g.5gb+me", Devices: 7, MemoryBytes: mib(4864), Multiprocessors: 14},
		PartitionModel{Profile: "1g.10gb", Devices: 4, MemoryBytes: mib(9856), Multiprocessors: 14},
		PartitionModel{Profile: "2g.10gb", Devices: 3, MemoryBytes: mib(9856), Multiprocessors: 28},
		PartitionModel{Profile: "3g.20gb", Devices: 2, MemoryBytes: mib(19968), Multiprocessors: 42},
		PartitionModel{Profile: "4g.20gb", Devices: 1, MemoryBytes: mib(19968), Multiprocessors: 56},
		PartitionModel{Profile: "7g.40gb", Devices: 1, MemoryBytes: mib(40192), Multiprocessors: 98})
	l4Whole = Model{Name: "NVIDIA L4", Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300, MemoryBytes: mib(23034), Multiprocessors: 58}
)

func migFleet(models []Model, partitions ...[]PartitionModel) *Fleet {
	f := &Fleet{Models: models}
	for _, p := range partitions {
		f.Partitions = append(f.Partitions, p...)
	}
	return f
}

// tierSummary is a subrequest as these tests read it.
type tierSummary struct {
	Name, Class string
}

func tierSummaries(r resourceapi.DeviceRequest) []tierSummary {
	var out []tierSummary
	for _, sub := range r.FirstAvailable {
		out = append(out, tierSummary{sub.Name, sub.DeviceClassName})
	}
	return out
}

// A request for one whole GPU gets the smallest published partition that
// holds its share ahead of the whole-GPU ladder; a heavy job, a fleet
// without partitions, a claim with its own selectors keep what they had.
func TestRewriteOffersThePartitionFirst(t *testing.T) {
	h100 := migFleet([]Model{h100Whole, l4Whole}, h100Partitions)
	a100 := migFleet([]Model{a100Whole, l4Whole}, a100Partitions)
	mixed := migFleet([]Model{a100Whole, h100Whole, l4Whole}, a100Partitions, h100Partitions)
	wholeOnly := migFleet([]Model{h100Whole, l4Whole})
	// light: p95 5 %, peak 3Gi: SizeShare gives 15 % compute, 5Gi memory.
	light := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("3Gi"), Usage: usage(5, "3Gi")}
	// memoryHeavy: p95 20 %, peak 30Gi: 30 % compute, 37Gi memory.
	memoryHeavy := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("30Gi"), Usage: usage(20, "30Gi")}
	// heavy: p95 70 %: 95 % compute, a whole GPU.
	heavy := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("6Gi"), Usage: usage(70, "6Gi")}
	// inference: busy small-batch inference, p95 duty cycle 90 % but 5 %
	// SM activity and 2 % DRAM use: 15 % compute, 5Gi memory.
	inference := heavy
	inference.Usage = withGPM(usage(90, "3Gi"), 5, 2)
	whole := func(names ...string) []tierSummary {
		var out []tierSummary
		for _, n := range names {
			out = append(out, tierSummary{n, TierDeviceClassName})
		}
		return out
	}
	mig := func(name string) tierSummary { return tierSummary{name, MIGDeviceClassName} }
	// The latency-bound ladder of these fleets ranks by FP32, top class
	// first; fits carries the memory floor.
	ladder := whole("fp32-top", "fits")
	configured := gpuSpec(exactGPU("gpu", 1))
	configured.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: gpuv1alpha1.DriverName, Parameters: runtime.RawExtension{Raw: []byte(`{}`)}}}}}

	for _, tc := range []struct {
		name     string
		profile  Profile
		fleet    *Fleet
		spec     *resourceapi.ResourceClaimSpec
		want     []tierSummary // the request "gpu"; nil: untouched
		verdict  string        // "": no partition plan
		profiles []string
	}{
		{"light on an H100: its 1g.20gb (1g.10gb has 12% of the SMs, below 15%)", light, h100, gpuSpec(exactGPU("gpu", 1)),
			append([]tierSummary{mig("mig-1g20gb")}, ladder...), "sized", []string{"1g.20gb"}},
		{"light on an A100-40GB: its 2g.10gb (a 1g has 13% of the SMs)", light, a100, gpuSpec(exactGPU("gpu", 1)),
			append([]tierSummary{mig("mig-2g10gb")}, ladder...), "sized", []string{"2g.10gb"}},
		{"light on both: each model's smallest, smallest memory first", light, mixed, gpuSpec(exactGPU("gpu", 1)),
			append([]tierSummary{mig("mig-2g10gb"), mig("mig-1g20gb")}, ladder...), "sized", []string{"2g.10gb", "1g.20gb"}},
		{"memory-heavy but light: a slice with 37Gi", memoryHeavy, h100, gpuSpec(exactGPU("gpu", 1)),
			// 30Gi needs the 39Gi floor: only the H100 holds it, so no
			// whole-GPU preference is left, only fits.
			append([]tierSummary{mig("mig-3g40gb")}, whole("fits")...), "sized", []string{"3g.40gb"}},
		{"too much memory for any slice below the whole A100-40GB", memoryHeavy, a100, gpuSpec(exactGPU("gpu", 1)),
			whole("fits"), "none-fits", nil},
		{"heavy: no slice", heavy, h100, gpuSpec(exactGPU("gpu", 1)), ladder, "heavy", nil},
		{"a busy duty cycle but few SMs busy: a small slice", inference, h100, gpuSpec(exactGPU("gpu", 1)),
			append([]tierSummary{mig("mig-1g20gb")}, ladder...), "sized", []string{"1g.20gb"}},
		{"no partitions in the fleet: as before", light, wholeOnly, gpuSpec(exactGPU("gpu", 1)), ladder, "", nil},
		{"the user's selectors: as before", light, h100, gpuSpec(exactGPU("gpu", 1, userSelector)),
			[]tierSummary{{"fp32-top", TierDeviceClassName}, {"fits", TierDeviceClassName}}, "no-eligible-request", nil},
		{"two GPUs: as before", light, h100, gpuSpec(exactGPU("gpu", 2)), ladder, "no-eligible-request", nil},
		{"a GpuConfig applies: as before", light, h100, configured, ladder, "no-eligible-request", nil},
		{"the profile says Exclusive", Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("3Gi"), Usage: usage(5, "3Gi"), Exclusive: true},
			h100, gpuSpec(exactGPU("gpu", 1)), ladder, "opted-out", nil},
		{"no usage", Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("3Gi")}, h100, gpuSpec(exactGPU("gpu", 1)),
			ladder, "no-usage", nil},
		{"no bound type: the slice, then the request as written", Profile{Name: "p", Usage: usage(5, "3Gi")}, h100, gpuSpec(exactGPU("gpu", 1)),
			[]tierSummary{mig("mig-1g20gb"), {"fits", DeviceClassName}}, "sized", []string{"1g.20gb"}},
		{"no bound type, heavy: untouched", Profile{Name: "p", Usage: usage(70, "6Gi")}, h100, gpuSpec(exactGPU("gpu", 1)), nil, "heavy", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			out, plan, err := Rewrite(ctx, tc.spec, tc.profile, WithFleet(tc.fleet), PartitionsFromUsage())
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			if diff := cmp.Diff(tc.want, tierSummaries(out.Devices.Requests[0])); diff != "" {
				t.Errorf("tiers (-want +got):\n%s", diff)
			}
			if tc.verdict == "" {
				if plan.Partition != nil {
					t.Errorf("a plan for partitions where none are published: %+v", plan.Partition)
				}
				return
			}
			if plan.Partition == nil {
				t.Fatal("the plan says nothing of partitions")
			}
			if plan.Partition.Verdict != tc.verdict {
				t.Errorf("verdict %q (%s), want %q", plan.Partition.Verdict, plan.Partition.Reason, tc.verdict)
			}
			if diff := cmp.Diff(tc.profiles, plan.Partition.Profiles); diff != "" {
				t.Errorf("profiles (-want +got):\n%s", diff)
			}
			for _, a := range plan.Alternatives {
				if tc.verdict != "sized" && strings.HasPrefix(a.Name, PartitionTierPrefix) {
					t.Errorf("alternatives list a partition no request got: %+v", plan.Alternatives)
				}
			}
		})
	}
}

// The partition tier asks for the profile by a catalogue selector, in the
// class of partitions, with nothing copied that a partition lacks; the
// last tier accepts what the request as written accepted.
func TestPartitionTierShape(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeLatencyBound, PeakMemory: qty("3Gi"), MinComputeCapability: "8.0", Usage: usage(5, "3Gi")}
	out, plan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), p, WithFleet(migFleet([]Model{h100Whole, l4Whole}, h100Partitions)), PartitionsFromUsage(),
		MemoryFloorAsCapacity(), TierBoundsAsCapacity())
	if err != nil {
		t.Fatal(err)
	}
	cc, _ := verifiedSelector(selCCFirst + 1)
	want := resourceapi.DeviceSubRequest{
		Name:            "mig-1g20gb",
		DeviceClassName: MIGDeviceClassName,
		Selectors:       []resourceapi.DeviceSelector{selector("(" + migProfileIs("1g.20gb") + joinSeparator + cc + ")")},
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           1,
	}
	subs := out.Devices.Requests[0].FirstAvailable
	if diff := cmp.Diff(want, subs[0]); diff != "" {
		t.Errorf("partition tier (-want +got):\n%s", diff)
	}
	if conj, ok := Conjuncts(subs[0].Selectors[0].CEL.Expression); !ok || len(conj) != 2 {
		t.Errorf("the partition selector is not made of catalogue entries: %v", conj)
	}
	// Partitions have no uuid: the guard would refuse them.
	if len(out.Devices.Constraints) != 0 || plan.TierBounds.Form != FormCEL {
		t.Errorf("constraints %v, tier bounds %v: want no uuid guard where a partition may be allocated", out.Devices.Constraints, plan.TierBounds)
	}
	if last := subs[len(subs)-1]; last.Name != "fits" {
		t.Errorf("last tier %s, want fits", last.Name)
	}
	s, err := plan.Annotation()
	if err != nil {
		t.Fatal(err)
	}
	var back Plan
	if err := json.Unmarshal([]byte(s), &back); err != nil || back.Partition == nil || back.Partition.Verdict != "sized" || back.Partition.Requests[0] != "gpu" {
		t.Errorf("the annotation loses the partition decision: %s (%v)", s, err)
	}
}

// plainProfile is a profile name without a media-engine variant.
var plainProfile = regexp.MustCompile(`^[0-9]+g\.[0-9]+gb$`)

// Every name of the catalogue is one NVIDIA spells without a media-engine
// variant (so the partition step never offers one), and each has its own
// entry.
func TestMIGProfileCatalogue(t *testing.T) {
	for _, n := range migProfileNames {
		if !plainProfile.MatchString(n) {
			t.Errorf("%q is not a plain profile name", n)
		}
		id, ok := migProfileSelector(n)
		if !ok {
			t.Fatalf("%q has no selector", n)
		}
		got, err := verifiedSelector(id)
		if err != nil || got != migProfileIs(n) {
			t.Errorf("%q: selector %q, %v", n, got, err)
		}
	}
	if _, ok := migProfileSelector("1g.10gb+me"); ok {
		t.Error("a media-engine variant has a selector")
	}
	if got := PartitionVerdict(len(partitionVerdicts)).String(); got != "PartitionVerdict(7)" {
		t.Errorf("an unknown verdict reads %q", got)
	}
}

// withGPM gives u the SM activity and DRAM bandwidth use GPM reports on
// Hopper and later, in per cent.
func withGPM(u *prismv1alpha1.UsageProfile, sm, dram float64) *prismv1alpha1.UsageProfile {
	u.SMActivityMilliPercent = ptr.To(int32(sm * 1000))
	u.DRAMActivityMilliPercent = ptr.To(int32(dram * 1000))
	return u
}

// partitionWant is what the SizePartition tests compare.
type partitionWant struct {
	Verdict         PartitionVerdict
	Compute, Memory int64
}

// TestSizePartition: a partition holds what the job keeps busy where GPM
// measured it, the share's limit from the duty cycle where not, worked by
// hand for each case.
func TestSizePartition(t *testing.T) {
	const gi = 1 << 30
	type want = partitionWant
	for _, tc := range []struct {
		name   string
		usage  *prismv1alpha1.UsageProfile
		want   want
		reason string
	}{
		// 5 + 10 = 15 %; 3Gi x 1.2 + 0.5Gi = 4.1Gi -> 5Gi.
		{"busy small-batch inference: SM activity sizes it", withGPM(usage(90, "3Gi"), 5, 2), want{PartitionSized, 15, 5 * gi},
			"compute 15% from an SM activity of 5% (DRAM bandwidth use 2%); memory 5Gi from a peak of 3Gi"},
		// DRAM 40 + 13.3 = 53.3 -> 55 % beats SM 10 + 10 = 20 %.
		{"bandwidth-bound: DRAM use sizes it", withGPM(usage(90, "3Gi"), 10, 40), want{PartitionSized, 55, 5 * gi},
			"compute 55% from a DRAM bandwidth use of 40% (SM activity 10%); memory 5Gi from a peak of 3Gi"},
		// 60 + 20 = 80 %.
		{"SMs busy: heavy", withGPM(usage(30, "3Gi"), 60, 10), want{PartitionHeavy, 80, 5 * gi},
			"compute 80% from an SM activity of 60% (DRAM bandwidth use 10%); memory 5Gi from a peak of 3Gi; 80% or more of a GPU keeps a whole one"},
		{"SM activity alone", func() *prismv1alpha1.UsageProfile {
			u := withGPM(usage(90, "3Gi"), 5, 0)
			u.DRAMActivityMilliPercent = nil
			return u
		}(), want{PartitionSized, 15, 5 * gi}, "compute 15% from an SM activity of 5%; memory 5Gi from a peak of 3Gi"},
		// The limit of a bursty job: p95 32 + 10.7 -> 45 %.
		{"no GPM: the share's limit", bursty(10, 32, "3Gi"), want{PartitionSized, 45, 5 * gi},
			"compute 45% from a p95 duty cycle of 32% (no SM activity measured, which Hopper and later GPUs report); memory 5Gi from a peak of 3Gi"},
		{"no GPM, a busy duty cycle: heavy", usage(70, "3Gi"), want{PartitionHeavy, 95, 5 * gi}, ""},
		{"no usage", nil, want{Verdict: PartitionNoUsage}, ""},
		{"no peak memory", withGPM(usage(90, ""), 5, 2), want{Verdict: PartitionNoPeakMemory}, ""},
		{"no peak memory, light", usage(30, ""), want{Verdict: PartitionNoPeakMemory}, ""},
		{"no peak memory, heavy by the duty cycle and no GPM: heavy", usage(90, ""), want{Verdict: PartitionHeavy}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := SizePartition(tc.usage, KernelShape{})
			if diff := cmp.Diff(tc.want, want{got.Verdict, got.ComputePercent, got.MemoryBytes}); diff != "" {
				t.Errorf("SizePartition (-want +got):\n%s", diff)
			}
			if tc.reason != "" && got.Reason != tc.reason {
				t.Errorf("reason %q, want %q", got.Reason, tc.reason)
			}
			if got.Reason == "" {
				t.Errorf("no reason given")
			}
		})
	}
}

// TestSizePartitionFromKernelShape: where GPM measured nothing, the share of
// the GPU ncu saw the kernels fill while they run, over the p95 duty cycle,
// stands in for the SM activity, worked by hand for each case.
func TestSizePartitionFromKernelShape(t *testing.T) {
	const gi = 1 << 30
	shape := func(waves string, dram float64) KernelShape {
		k := KernelShape{WavesPerSM: ptr.To(resource.MustParse(waves))}
		if dram >= 0 {
			k.DRAMThroughputMilliPercent = ptr.To(int32(dram * 1000))
		}
		return k
	}
	type want = partitionWant
	for _, tc := range []struct {
		name    string
		usage   *prismv1alpha1.UsageProfile
		kernels KernelShape
		want    want
		reason  string
	}{{
		// 5 % x 0.9 = 4.5 %, + 10 = 14.5 -> 15 %.
		name: "busy small-batch inference on an A100: a small grid sizes it", usage: usage(90, "3Gi"), kernels: shape("0.05", 2),
		want:   want{PartitionSized, 15, 5 * gi},
		reason: "compute 15% from kernels that fill 5% of the GPU while they run (ncu: a grid of 0.05 waves per SM and a DRAM throughput of 2%) for a p95 duty cycle of 90% (no SM activity measured, which Hopper and later GPUs report); memory 5Gi from a peak of 3Gi",
	}, {
		// DRAM 60 % x 0.5 = 30 %, + 10 = 40 %.
		name: "DRAM throughput beyond the grid sizes it", usage: usage(50, "3Gi"), kernels: shape("0.1", 60),
		want: want{PartitionSized, 40, 5 * gi},
	}, {
		// A grid of 2 waves fills the GPU: 100 % x 0.3, + 10 = 40 %.
		name: "a full grid, seldom running", usage: usage(30, "3Gi"), kernels: shape("2", -1),
		want:   want{PartitionSized, 40, 5 * gi},
		reason: "compute 40% from kernels that fill 100% of the GPU while they run (ncu: a grid of 2.00 waves per SM) for a p95 duty cycle of 30% (no SM activity measured, which Hopper and later GPUs report); memory 5Gi from a peak of 3Gi",
	}, {
		name: "a full grid, busy: heavy", usage: usage(90, "3Gi"), kernels: shape("1.5", 10),
		want: want{PartitionHeavy, 100, 5 * gi},
	}, {
		name: "GPM, where measured, comes first", usage: withGPM(usage(90, "3Gi"), 5, 2), kernels: shape("2", 90),
		want: want{PartitionSized, 15, 5 * gi},
	}, {
		name: "no grid measured: the duty cycle", usage: usage(70, "3Gi"), kernels: KernelShape{DRAMThroughputMilliPercent: ptr.To[int32](2000)},
		want: want{PartitionHeavy, 95, 5 * gi},
	}, {
		name: "a figure no ncu reports: the duty cycle", usage: usage(70, "3Gi"), kernels: shape("-1", 2),
		want: want{PartitionHeavy, 95, 5 * gi},
	}, {
		// Heavy by its duty cycle, not by its grid; a partition's memory is
		// not guessed.
		name: "no peak memory", usage: usage(90, ""), kernels: shape("0.05", 2),
		want: want{Verdict: PartitionNoPeakMemory},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := SizePartition(tc.usage, tc.kernels)
			if diff := cmp.Diff(tc.want, want{got.Verdict, got.ComputePercent, got.MemoryBytes}); diff != "" {
				t.Errorf("SizePartition (-want +got):\n%s\nreason: %s", diff, got.Reason)
			}
			if tc.reason != "" && got.Reason != tc.reason {
				t.Errorf("reason %q, want %q", got.Reason, tc.reason)
			}
		})
	}
}
