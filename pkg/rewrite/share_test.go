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
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// usage is a profile measured over three runs with the given p95 duty
// cycle (per cent) and peak memory ("" for unknown).
// usage is a steady job's: its p50 duty cycle is its p95, so its share's
// request is its limit. bursty gives a p50 of its own.
func usage(p95 float64, peak string) *prismv1alpha1.UsageProfile {
	return bursty(p95, p95, peak)
}

func bursty(p50, p95 float64, peak string) *prismv1alpha1.UsageProfile {
	u := &prismv1alpha1.UsageProfile{
		DutyCycleP50MilliPercent: ptr.To(int32(p50 * 1000)),
		DutyCycleP95MilliPercent: ptr.To(int32(p95 * 1000)),
		Runs:                     3,
		Samples:                  600,
	}
	if peak != "" {
		u.PeakMemory = ptr.To(resource.MustParse(peak))
	}
	return u
}

func exceeded(u *prismv1alpha1.UsageProfile, computePercent int32, memory string, what ...prismv1alpha1.ShareResource) *prismv1alpha1.UsageProfile {
	u.Share = &prismv1alpha1.GrantedShare{ComputePercent: computePercent, Memory: ptr.To(resource.MustParse(memory))}
	u.Exceeded = &prismv1alpha1.ShareExceeded{Resources: what}
	return u
}

// The sizing rule, worked by hand for each case. A steady job (usage) has
// its request at its limit; a bursty one's request comes from its p50.
func TestSizeShare(t *testing.T) {
	sized := func(computePercent int32, memoryBytes int64) gpuv1alpha1.Share {
		return gpuv1alpha1.Share{ComputePercent: computePercent, MemoryBytes: memoryBytes}
	}
	type want struct {
		Verdict ShareVerdict
		Share   gpuv1alpha1.Share
		Limit   int32
		Raised  []prismv1alpha1.ShareResource
	}
	const gi = 1 << 30
	for _, tc := range []struct {
		name  string
		usage *prismv1alpha1.UsageProfile
		want  want
	}{
		// 32 + max(10, 10.7) = 42.7 -> 45 %; 6Gi x 1.2 + 0.5Gi = 7.7Gi -> 8Gi.
		{"hand-worked", usage(32, "6Gi"), want{ShareSized, sized(45, 8*gi), 45, nil}},
		// 48 + max(10, 16) = 64 -> 65 %; 20Gi x 1.2 + 0.5Gi = 24.5Gi -> 25Gi.
		{"a third of the p95 is the headroom above 30 %", usage(48, "20Gi"), want{ShareSized, sized(65, 25*gi), 65, nil}},
		// 32.5 + 10.8 = 43.3 -> 45 %.
		{"fractions of a per cent round up", usage(32.5, "6Gi"), want{ShareSized, sized(45, 8*gi), 45, nil}},
		// 0 + 10 = 10 %; 1Mi x 1.2 + 0.5Gi -> 1Gi.
		{"floors", usage(0, "1Mi"), want{ShareSized, sized(10, 1*gi), 10, nil}},
		// A peak in bytes, as NVML reports it: 7000000000 x 1.2 + 512Mi
		// = 8936870912 -> 9Gi.
		{"a peak that is not round", usage(20, "7000000000"), want{ShareSized, sized(30, 9*gi), 30, nil}},
		// 60 + 20 = 80 %: heavy.
		{"heavy", usage(60, "6Gi"), want{ShareHeavy, sized(80, 8*gi), 80, nil}},
		// 56 + 18.7 = 74.7 -> 75 %: the largest share.
		{"just below heavy", usage(56, "6Gi"), want{ShareSized, sized(75, 8*gi), 75, nil}},
		{"heavy without a peak is heavy", usage(90, ""), want{ShareHeavy, gpuv1alpha1.Share{ComputePercent: 100}, 100, nil}},
		{"no peak memory", usage(32, ""), want{ShareNoPeakMemory, gpuv1alpha1.Share{ComputePercent: 45}, 45, nil}},
		{"a zero peak is no peak", usage(32, "0"), want{ShareNoPeakMemory, gpuv1alpha1.Share{ComputePercent: 45}, 45, nil}},
		{"a peak out of range", usage(32, "1E30"), want{ShareNoPeakMemory, gpuv1alpha1.Share{ComputePercent: 45}, 45, nil}},
		{"nil usage", nil, want{Verdict: ShareNoUsage}},
		{"no runs", &prismv1alpha1.UsageProfile{DutyCycleP95MilliPercent: ptr.To(int32(32000)), PeakMemory: ptr.To(resource.MustParse("6Gi"))}, want{Verdict: ShareNoUsage}},
		{"no p95", &prismv1alpha1.UsageProfile{Runs: 2, PeakMemory: ptr.To(resource.MustParse("6Gi"))}, want{Verdict: ShareNoUsage}},
		// Request 16 + 10 = 26 -> 30 %, limit 32 + 10 = 42 -> 45 %.
		{"bursty: the request from the p50, the limit from the p95", bursty(16, 32, "6Gi"), want{ShareSized, sized(30, 8*gi), 45, nil}},
		// Request 10 + 10 = 20 %, limit 70 + 23.3 -> 95 %: the request is
		// raised to half the limit, 47.5 -> 50 %.
		{"a limit past twice the request raises the request", bursty(10, 70, "6Gi"), want{ShareSized, sized(50, 8*gi), 95, nil}},
		// Request 70 + 23.3 -> 95 %: heavy, whatever the limit (100 %).
		{"a heavy request", bursty(70, 90, "6Gi"), want{ShareHeavy, sized(95, 8*gi), 100, nil}},
		// A p50 above the p95 (a status written by hand) is read as the p95.
		{"a p50 above the p95", bursty(40, 30, "6Gi"), want{ShareSized, sized(40, 8*gi), 40, nil}},
		{"no p50: steady", func() *prismv1alpha1.UsageProfile {
			u := usage(32, "6Gi")
			u.DutyCycleP50MilliPercent = nil
			return u
		}(), want{ShareSized, sized(45, 8*gi), 45, nil}},
		// The last run had 20 % and 6Gi and outgrew its memory: 12Gi beats
		// the 8Gi the figures give; compute stays 45 %.
		{"exceeded memory doubles it", exceeded(usage(32, "6Gi"), 20, "6Gi", prismv1alpha1.ShareResourceMemory),
			want{ShareSized, sized(45, 12*gi), 45, []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceMemory}}},
		// The last run was held to a limit of 30 %: twice it is 60 %, above
		// the 45 % of the figures; the request stays 45 %.
		{"exceeded compute doubles the limit", exceeded(usage(32, "6Gi"), 30, "8Gi", prismv1alpha1.ShareResourceCompute),
			want{ShareSized, sized(45, 8*gi), 60, []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceCompute}}},
		// Twice 45 % is a limit of 90 %, which raises the request to 45 %.
		{"exceeded compute of a bursty job", exceeded(bursty(10, 32, "6Gi"), 45, "8Gi", prismv1alpha1.ShareResourceCompute, prismv1alpha1.ShareResourceMemory),
			want{ShareSized, sized(45, 16*gi), 90, []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceCompute, prismv1alpha1.ShareResourceMemory}}},
		// The figures already give more than twice the grant.
		{"the figures beat the doubling", exceeded(usage(32, "20Gi"), 10, "4Gi", prismv1alpha1.ShareResourceMemory),
			want{ShareSized, sized(45, 25*gi), 45, []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceMemory}}},
		{"exceeded without a grant", func() *prismv1alpha1.UsageProfile {
			u := usage(32, "6Gi")
			u.Exceeded = &prismv1alpha1.ShareExceeded{Resources: []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceMemory}}
			return u
		}(), want{ShareSized, sized(45, 8*gi), 45, nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := SizeShare(tc.usage)
			if diff := cmp.Diff(tc.want, want{s.Verdict, s.Share, s.ComputePeakPercent, s.Raised}); diff != "" {
				t.Errorf("SizeShare (-want +got):\n%s", diff)
			}
			if s.Reason == "" {
				t.Errorf("no reason given")
			}
		})
	}
}

func TestShareReasonsAndSummary(t *testing.T) {
	u := exceeded(bursty(16, 32, "6Gi"), 20, "6Gi", prismv1alpha1.ShareResourceMemory)
	u.ProductName = "NVIDIA L4"
	if diff := cmp.Diff("compute 30% from a p50 duty cycle of 16%, up to 45% from a p95 of 32%; memory 8Gi from a peak of 6Gi; memory at least twice the 6Gi the last run outgrew",
		SizeShare(u).Reason); diff != "" {
		t.Errorf("reason (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("duty cycle p50 16% p95 32%, peak memory 6Gi, 3 runs on NVIDIA L4, the last run outgrew its memory",
		UsageSummary(u)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff("compute 80% from a p95 duty cycle of 60%; memory 8Gi from a peak of 6Gi; 80% or more of a GPU keeps a whole one",
		SizeShare(usage(60, "6Gi")).Reason); diff != "" {
		t.Errorf("heavy reason (-want +got):\n%s", diff)
	}
	if got := UsageSummary(bursty(16.25, 32.5, "7000000000")); got != "duty cycle p50 16.2% p95 32.5%, peak memory 6676Mi, 3 runs" {
		t.Errorf("summary of odd figures = %q", got)
	}
}

func TestShareVerdictStrings(t *testing.T) {
	seen := map[string]bool{}
	for _, v := range ShareVerdicts() {
		s := v.String()
		if seen[s] || s == "" {
			t.Errorf("verdict %d has a duplicate or empty label %q", int(v), s)
		}
		seen[s] = true
	}
	if got := ShareVerdict(len(shareVerdicts)).String(); got != "ShareVerdict(7)" {
		t.Errorf("an unknown verdict reads %q", got)
	}
}

// subSummary is a subrequest as the test reads it: each
// subrequest's name and capacity requests.
type subSummary struct {
	Name     string
	Capacity map[string]string
}

func summarize(r resourceapi.DeviceRequest) []subSummary {
	var out []subSummary
	for _, sub := range r.FirstAvailable {
		s := subSummary{Name: sub.Name}
		if sub.Capacity != nil {
			s.Capacity = map[string]string{}
			for k, q := range sub.Capacity.Requests {
				s.Capacity[string(k)] = q.String()
			}
		}
		out = append(out, s)
	}
	return out
}

// A claim for one whole GPU gets the share first and its whole-GPU ladder
// after it; what keeps whole GPUs, and why, is in the plan.
func TestRewriteOffersTheShareFirst(t *testing.T) {
	share := map[string]string{"gpu.prism.dev/compute": "45", "gpu.prism.dev/memory": "8Gi"}
	measured := usage(32, "6Gi")
	memoryBound := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("6Gi"), Usage: measured}
	withCapacity := exactGPU("gpu", 1)
	withCapacity.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"gpu.prism.dev/memory": resource.MustParse("20Gi")}}
	for _, tc := range []struct {
		name    string
		profile Profile
		spec    *resourceapi.ResourceClaimSpec
		opts    []Option
		want    map[string][]subSummary // per request; absent: untouched
		verdict string
		whole   []Untouched
	}{
		{"ahead of the ladder", memoryBound, gpuSpec(exactGPU("gpu", 1)), nil,
			map[string][]subSummary{"gpu": {{"share", share}, {Name: "ultra"}, {Name: "high"}, {Name: "fits"}}}, "sized", nil},
		{"a profile without a bound type: the share, then the request as written",
			Profile{Name: "p", Usage: measured}, gpuSpec(exactGPU("gpu", 1)), nil,
			map[string][]subSummary{"gpu": {{"share", share}, {Name: "fits"}}}, "sized", nil},
		{"heavy keeps the ladder", Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("6Gi"), Usage: usage(70, "6Gi")},
			gpuSpec(exactGPU("gpu", 1)), nil,
			map[string][]subSummary{"gpu": {{Name: "ultra"}, {Name: "high"}, {Name: "fits"}}}, "heavy", nil},
		{"no usage, balanced: unchanged", Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeBalanced}, gpuSpec(exactGPU("gpu", 1)), nil,
			nil, "no-usage", nil},
		{"the profile says Exclusive", Profile{Name: "p", Usage: measured, Exclusive: true}, gpuSpec(exactGPU("gpu", 1)), nil,
			nil, "opted-out", nil},
		{"the claim's GpuConfig says Exclusive", Profile{Name: "p", Usage: measured}, withSharing(gpuSpec(exactGPU("gpu", 1)), gpuv1alpha1.ExclusiveSharing), nil,
			nil, "opted-out", []Untouched{{"gpu", "its GpuConfig sets sharing.strategy Exclusive"}}},
		// A share cannot be time-sliced; the validating webhook would
		// refuse the claim with a share tier.
		{"the claim's GpuConfig says TimeSlicing", memoryBound, withSharing(gpuSpec(exactGPU("gpu", 1)), gpuv1alpha1.TimeSlicingSharing), nil,
			map[string][]subSummary{"gpu": {{Name: "ultra"}, {Name: "high"}, {Name: "fits"}}}, "opted-out",
			[]Untouched{{"gpu", "its GpuConfig sets a sharing strategy that a share cannot take"}}},
		{"several GPUs, or amounts named, keep whole GPUs", memoryBound, gpuSpec(exactGPU("one", 1), exactGPU("two", 2), withCapacity), nil,
			map[string][]subSummary{
				"one": {{"share", share}, {Name: "ultra"}, {Name: "high"}, {Name: "fits"}},
				"two": {{Name: "ultra"}, {Name: "high"}, {Name: "fits"}},
				"gpu": {{Name: "ultra", Capacity: map[string]string{"gpu.prism.dev/memory": "20Gi"}}, {Name: "high", Capacity: map[string]string{"gpu.prism.dev/memory": "20Gi"}}, {Name: "fits", Capacity: map[string]string{"gpu.prism.dev/memory": "20Gi"}}},
			}, "sized", []Untouched{{"two", "asks for more than one GPU; a share is a part of one"}, {"gpu", "names its own capacity amounts, which are kept"}}},
		{"a fleet without shareable GPUs", memoryBound, gpuSpec(exactGPU("gpu", 1)), []Option{WithFleet(&Fleet{Models: []Model{{Name: "NVIDIA L4", Devices: 2, BandwidthGBps: 300, MemoryBytes: 24 << 30}}})},
			map[string][]subSummary{"gpu": {{Name: "fits"}}}, "no-shareable-gpu", nil},
		{"a fleet whose shareable GPUs are too small", memoryBound, gpuSpec(exactGPU("gpu", 1)), []Option{WithFleet(&Fleet{Models: []Model{{Name: "NVIDIA T4", Devices: 2, SharedDevices: 2, BandwidthGBps: 320, MemoryBytes: 7 << 30}}})},
			map[string][]subSummary{"gpu": {{Name: "fits"}}}, "no-shareable-gpu", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			out, plan, err := Rewrite(ctx, tc.spec, tc.profile, append(tc.opts, ShareFromUsage())...)
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			got := map[string][]subSummary{}
			for _, r := range out.Devices.Requests {
				if r.FirstAvailable != nil {
					got[r.Name] = summarize(r)
				}
			}
			if len(got) == 0 {
				got = nil
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("rewritten requests (-want +got):\n%s", diff)
			}
			if plan.Share == nil {
				t.Fatalf("the plan says nothing of the share")
			}
			if plan.Share.Verdict != tc.verdict {
				t.Errorf("verdict %q (%s), want %q", plan.Share.Verdict, plan.Share.Reason, tc.verdict)
			}
			if diff := cmp.Diff(tc.whole, plan.Share.Whole); diff != "" {
				t.Errorf("requests kept whole (-want +got):\n%s", diff)
			}
			if (plan.Share.Memory != nil) != (tc.verdict == "sized") {
				t.Errorf("plan share memory %v with verdict %s", plan.Share.Memory, plan.Share.Verdict)
			}
			if tc.verdict != "sized" && slices.ContainsFunc(plan.Alternatives, func(a Alternative) bool { return a.Name == ShareTierName }) {
				t.Errorf("alternatives list the share that no request got: %+v", plan.Alternatives)
			}
		})
	}
}

// Without ShareFromUsage the plan and the claim are what they were before
// shares existed, usage or not.
func TestRewriteWithoutSharesIgnoresUsage(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	p := Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("6Gi")}
	before, beforePlan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), p)
	if err != nil {
		t.Fatal(err)
	}
	p.Usage = usage(32, "6Gi")
	after, afterPlan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(before, after); diff != "" {
		t.Errorf("usage changed the claim without ShareFromUsage (-before +after):\n%s", diff)
	}
	if diff := cmp.Diff(beforePlan, afterPlan); diff != "" {
		t.Errorf("usage changed the plan without ShareFromUsage (-before +after):\n%s", diff)
	}
}

// computeShareable publishes the fleet's GPUs as the kubelet plugin does
// with --consumable-capacity: memory and compute both shareable.
func computeShareable(f *fleet) *fleet {
	f = shareable(f)
	step, whole := resource.MustParse("5"), resource.MustParse("100")
	for _, s := range f.slices {
		for i := range s.Spec.Devices {
			s.Spec.Devices[i].Capacity[gpuv1alpha1.ComputeCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: whole, RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: &whole, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &step, Max: &whole, Step: &step}}}
		}
	}
	return f
}

// The allocator, as kube-scheduler runs it with DRAConsumableCapacity:
// a shareable GPU grants the share, and two shares of 45 % fit on one GPU
// where a third does not; a GPU that is not shareable never matches the
// share and gives the whole GPU through the last tier.
func TestAllocatorGrantsTheShare(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	// 81559Mi of memory hold three 8Gi shares: only compute runs out.
	shared := computeShareable(qualifiedCapacity(newFleet(t, "H100", 1, 1)))
	whole := qualifiedCapacity(newFleet(t, "L4", 1, 1))
	p := Profile{Name: "p", Usage: usage(32, "6Gi")}
	spec, _, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), p, ShareFromUsage())
	if err != nil {
		t.Fatal(err)
	}

	a, _ := whole.allocator(t, incubatingFeatures, nil)
	res, err := a.Allocate(ctx, whole.nodes[0], []*resourceapi.ResourceClaim{claimFor(spec)})
	if err != nil || len(res) != 1 {
		t.Fatalf("not allocated on a GPU that is not shareable: %v", err)
	}
	if r := res[0].Devices.Results[0]; r.Request != "gpu/fits" || len(r.ConsumedCapacity) > 0 {
		t.Errorf("on a GPU that is not shareable: %s consuming %v, want gpu/fits, the whole GPU", r.Request, r.ConsumedCapacity)
	}

	// Three claims allocated together, as the scheduler does for the
	// claims of one pod: the third finds 10 % compute left.
	a, _ = shared.allocator(t, incubatingFeatures, nil)
	var claims []*resourceapi.ResourceClaim
	for i := range 3 {
		c := claimFor(spec)
		c.Name, c.UID = fmt.Sprintf("claim-%d", i), types.UID(fmt.Sprintf("uid-%d", i))
		claims = append(claims, c)
	}
	res, err = a.Allocate(ctx, shared.nodes[0], claims[:2])
	if err != nil || len(res) != 2 {
		t.Fatalf("two shares not allocated on one GPU: %v, %d results", err, len(res))
	}
	for i, r := range res {
		got := r.Devices.Results[0]
		want := map[resourceapi.QualifiedName]resource.Quantity{
			gpuv1alpha1.ComputeCapacity.Qualified(): resource.MustParse("45"),
			gpuv1alpha1.MemoryCapacity.Qualified():  resource.MustParse("8Gi"),
		}
		if got.Request != "gpu/share" || got.ShareID == nil {
			t.Errorf("claim %d: allocated through %s (share ID %v), want gpu/share", i, got.Request, got.ShareID)
		}
		if diff := cmp.Diff(want, got.ConsumedCapacity); diff != "" {
			t.Errorf("claim %d consumed (-want +got):\n%s", i, diff)
		}
	}
	res, err = a.Allocate(ctx, shared.nodes[0], claims)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 0 {
		t.Errorf("three 45%% shares allocated on one GPU: %+v", res)
	}
}

// TestABurstyShareIsCountedAtItsRequest: a share whose peak is above its
// request is counted at its request, its peak is in the plan, and no
// config is added: nothing caps a share's SMs unless its author asks.
// Where a GPU's kubelet plugin is from before that rule, and holds a share
// to its request, the share is counted at its peak.
func TestABurstyShareIsCountedAtItsRequest(t *testing.T) {
	opaque := func(requests []string, raw string) resourceapi.DeviceClaimConfiguration {
		return resourceapi.DeviceClaimConfiguration{Requests: requests, DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: gpuv1alpha1.DriverName, Parameters: runtime.RawExtension{Raw: []byte(raw)},
		}}}
	}
	uncapped := &Fleet{Models: []Model{{Name: "NVIDIA L4", Devices: 2, SharedDevices: 2, ComputeLimitDevices: 2, BandwidthGBps: 300, MemoryBytes: 24 << 30}}}
	older := &Fleet{Models: []Model{{Name: "NVIDIA L4", Devices: 2, SharedDevices: 2, ComputeLimitDevices: 1, BandwidthGBps: 300, MemoryBytes: 24 << 30}}}
	profiling := opaque(nil, `{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`)
	for _, tc := range []struct {
		name    string
		usage   *prismv1alpha1.UsageProfile
		fleet   *Fleet
		configs []resourceapi.DeviceClaimConfiguration
		// compute is the share's request, peak the plan's peak.
		compute string
		peak    int64
	}{
		{"steady: no peak above the request", usage(32, "6Gi"), uncapped, nil, "45", 0},
		{"bursty: counted at its request", bursty(16, 32, "6Gi"), uncapped, nil, "30", 45},
		{"the author's config is kept as written", bursty(16, 32, "6Gi"), uncapped, []resourceapi.DeviceClaimConfiguration{profiling}, "30", 45},
		{"a plugin that caps at the request: counted at the peak", bursty(16, 32, "6Gi"), older, nil, "45", 0},
		{"no fleet view: counted at the peak", bursty(16, 32, "6Gi"), nil, nil, "45", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			spec := gpuSpec(exactGPU("gpu", 1))
			spec.Devices.Config = tc.configs
			opts := []Option{ShareFromUsage()}
			if tc.fleet != nil {
				opts = append(opts, WithFleet(tc.fleet))
			}
			out, plan, err := Rewrite(ctx, spec, Profile{Name: "p", Usage: tc.usage}, opts...)
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			if got := summarize(out.Devices.Requests[0])[0].Capacity["gpu.prism.dev/compute"]; got != tc.compute {
				t.Errorf("the share requests %s compute, want %s", got, tc.compute)
			}
			if diff := cmp.Diff(tc.configs, out.Devices.Config, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("configs (-want +got):\n%s", diff)
			}
			if plan.Share.ComputePeakPercent != tc.peak {
				t.Errorf("plan's peak %d, want %d", plan.Share.ComputePeakPercent, tc.peak)
			}
		})
	}
}

// TestShareRuleString: the sensitivity table names each rule by its
// parameters.
func TestShareRuleString(t *testing.T) {
	for _, tc := range []struct {
		rule ShareRule
		want string
	}{
		{DefaultShareRule, "request p50+max(10,p50/3), peak p95+max(10,p95/3), heavy 80"},
		{ShareRule{RequestHeadroom: Headroom{MinMilli: 5_000}, PeakHeadroom: Headroom{MinMilli: 12_500, Divisor: 2}, HeavyPercent: 60},
			"request p50+5, peak p95+max(12.5,p95/2), heavy 60"},
	} {
		if got := tc.rule.String(); got != tc.want {
			t.Errorf("String() = %q, want %q", got, tc.want)
		}
	}
}

// TestCountedAtALimitOf80IsHeavy: a share that cannot be given its limit
// is counted at it, and a limit of 80 % or more then keeps a whole GPU,
// as it did before limits.
func TestCountedAtALimitOf80IsHeavy(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	// Request 40 + 13.3 -> 55 %, limit 70 + 23.3 -> 95 %.
	_, plan, err := Rewrite(ctx, gpuSpec(exactGPU("gpu", 1)), Profile{Name: "p", Usage: bursty(40, 70, "6Gi")}, ShareFromUsage())
	if err != nil {
		t.Fatalf("Rewrite: %v", err)
	}
	if plan.Share == nil || plan.Share.Verdict != ShareHeavy.String() {
		t.Errorf("share plan %+v, want heavy", plan.Share)
	}
}
