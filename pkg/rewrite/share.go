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
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// ShareVerdict is what the share step decided for a claim: a share of a
// GPU first, or why the claim keeps whole GPUs. Its String is the plan's
// share.verdict and the webhook's metric label.
type ShareVerdict int

const (
	// ShareSized: the claim's first choice is a share sized from its
	// profile's usage.
	ShareSized ShareVerdict = iota
	// ShareNoUsage: the profile has no usage figures (never measured by
	// NVML, or no duty cycle): the claim keeps what it asked for.
	ShareNoUsage
	// ShareNoPeakMemory: the duty cycle is known but the peak memory is
	// not. Memory is what MPS pins, and guessing it is unsafe.
	ShareNoPeakMemory
	// ShareHeavy: the share would be 80 % of the GPU or more, which leaves
	// too little beside it to be worth the interference.
	ShareHeavy
	// ShareOptedOut: the profile's spec.sharing or every GPU request's
	// GpuConfig says Exclusive.
	ShareOptedOut
	// ShareNoShareableGPU: the fleet publishes no GPU shareable, so a
	// share could only cost the scheduler a failing tier.
	ShareNoShareableGPU
	// ShareNoEligibleRequest: no request asks for exactly one whole GPU.
	ShareNoEligibleRequest
)

var shareVerdicts = [...]string{"sized", "no-usage", "no-peak-memory", "heavy", "opted-out", "no-shareable-gpu", "no-eligible-request"}

func (v ShareVerdict) String() string { return verdictName(v, shareVerdicts[:], "ShareVerdict") }

// ShareVerdicts lists every verdict: the metric's label values.
func ShareVerdicts() []ShareVerdict { return allVerdicts[ShareVerdict](len(shareVerdicts)) }

// The share-sizing rule (docs/sharing.md). A share's compute is counted
// by the scheduler at its typical use (its request: the p50 duty cycle plus
// headroom), kept within gpuv1alpha1.MaxComputeLimitFactor of its peak (the
// p95 plus headroom), so that the shares a GPU holds leave room for their
// bursts. Neither is a cap: the GPU time-slices between shares, so a cap
// on a share's SMs keeps no share from slowing another and only slows the
// one that holds it. Memory gets the peak plus a margin, because MPS pins
// it and a job past its pin fails allocations.
const (
	// computeStepPercent is the step the plugin publishes
	// (gpu.ComputeShareStep); computeFloorPercent the least share Rewrite
	// asks for, because below it a job's launch latency dominates.
	computeStepPercent  = 5
	computeFloorPercent = 10
	// HeavyComputePercent is where a share stops paying: a job whose
	// request is this much of a GPU keeps a whole one.
	HeavyComputePercent = 80
	// memoryMarginDivisor (a fifth, 20 %) and memoryMarginFixed cover
	// run-to-run variance of the peak and the MPS server's own use.
	memoryMarginDivisor = 5
	memoryMarginFixed   = 512 << 20
	// memoryStep is the step the plugin publishes (gpu.MemoryShareStep),
	// and the floor.
	memoryStep = 1 << 30
	// exceededFactor is how much more a resource the last run exceeded
	// gets than it was granted.
	exceededFactor = 2
)

// ShareRule holds the share-sizing rule's parameters. DefaultShareRule is
// what ships and what SizeShare applies; other values exist only to
// measure how the evaluation depends on them (make bench's share-rule
// phase), never to configure a cluster.
type ShareRule struct {
	// RequestHeadroom is added to the p50 duty cycle for the request,
	// PeakHeadroom to the p95 for the peak.
	RequestHeadroom, PeakHeadroom Headroom
	// HeavyPercent is the request from which a job keeps a whole GPU.
	HeavyPercent int64
}

// Headroom is the larger of MinMilli thousandths of a per cent and the
// duty cycle over Divisor (none where Divisor is 0).
type Headroom struct {
	MinMilli, Divisor int64
}

// DefaultShareRule: 10 points, or a third of the duty cycle where that is
// more, so that a busier job gets more room for its variance, on both
// figures; a request of 80 % keeps a whole GPU. Of the rules make bench's
// share-rule phase judges, it packs the most on the shipped P100 data
// while keeping every load, with labels right or 20 % wrong, within the
// interference target; a quarter packed more but missed it at 20 %
// (docs/sharing.md links the measurement).
var DefaultShareRule = ShareRule{
	RequestHeadroom: Headroom{MinMilli: 10_000, Divisor: 3},
	PeakHeadroom:    Headroom{MinMilli: 10_000, Divisor: 3},
	HeavyPercent:    HeavyComputePercent,
}

// String is the rule as the sensitivity table prints it:
// "request p50+max(10,p50/3), peak p95+max(10,p95/3), heavy 80".
func (r ShareRule) String() string {
	return fmt.Sprintf("request p50+%s, peak p95+%s, heavy %d", r.RequestHeadroom.text("p50"), r.PeakHeadroom.text("p95"), r.HeavyPercent)
}

func (h Headroom) text(of string) string {
	min := milliPercent(h.MinMilli)
	min = strings.TrimSuffix(min, "%")
	if h.Divisor == 0 {
		return min
	}
	return fmt.Sprintf("max(%s,%s/%d)", min, of, h.Divisor)
}

// add is a duty cycle in thousandths of a per cent plus the headroom, in
// whole per cent rounded up to the step, from the floor to the whole GPU.
func (h Headroom) add(milli int64) int64 {
	room := h.MinMilli
	if h.Divisor > 0 {
		room = max(room, ceilDiv(milli, h.Divisor))
	}
	c := max(roundUp(milli+room, computeStepPercent*1000)/1000, computeFloorPercent)
	return min(c, gpuv1alpha1.MaxComputePercent)
}

// ShareSize is the share-sizing rule's answer for one usage profile.
type ShareSize struct {
	// Verdict is ShareSized, ShareNoUsage, ShareNoPeakMemory or ShareHeavy.
	Verdict ShareVerdict
	// Share is the share for ShareSized, as the scheduler counts it:
	// compute, the request, a multiple of 5 % from 10 % to 75 %, memory in
	// whole GiB. For ShareHeavy and ShareNoPeakMemory it is what the
	// figures came to, its memory zero where the peak is unknown.
	Share gpuv1alpha1.Share
	// ComputePeakPercent is the compute the share's runs reach at their
	// p95, with headroom: from Share's compute to
	// gpuv1alpha1.MaxComputeLimitFactor times it, within the GPU. It caps
	// nothing.
	ComputePeakPercent int32
	// Raised lists what was raised to twice the newest run's grant because
	// that run exceeded it.
	Raised []prismv1alpha1.ShareResource
	// Reason says how the figures gave the share, or why there is none.
	Reason string
}

// Peak is the share at its peak: what a MIG partition, which cannot
// burst, must hold.
func (s ShareSize) Peak() gpuv1alpha1.Share {
	p := s.Share
	p.ComputePercent = max(p.ComputePercent, s.ComputePeakPercent)
	return p
}

// SizeShare applies the share-sizing rule to a WorkloadProfile's
// status.usage. It is the one place the rule lives: the admission webhook
// and prismctl simulate's Prism policy both call it.
//
//   - No usage (nil, no runs, no p95 duty cycle): ShareNoUsage.
//   - Peak: p95 duty cycle + max(10 points, a third of it), rounded up
//     to 5 %, at least 10 %, at most 100 %.
//   - Request: the same of the p50 duty cycle (of the p95 where no p50 is
//     known), at most the peak, and at least half the peak, so that the
//     peak is within gpuv1alpha1.MaxComputeLimitFactor of it.
//   - Memory: peak × 1.2 + 512Mi, rounded up to 1Gi, at least 1Gi; no peak
//     known: ShareNoPeakMemory.
//   - The newest run exceeded its share: its memory, or the compute cap its
//     config asked for,
//     gets at least twice what was granted.
//   - A request of 80 % or more: ShareHeavy, a whole GPU.
func SizeShare(u *prismv1alpha1.UsageProfile) ShareSize { return DefaultShareRule.Size(u) }

// Size applies r to a WorkloadProfile's status.usage (see SizeShare).
func (r ShareRule) Size(u *prismv1alpha1.UsageProfile) ShareSize {
	if u == nil || u.Runs == 0 || u.DutyCycleP95MilliPercent == nil {
		return ShareSize{Verdict: ShareNoUsage, Reason: "no usage measured yet: the claim keeps what it asked for"}
	}
	p95 := clampMilliPercent(*u.DutyCycleP95MilliPercent)
	burst := r.PeakHeadroom.add(p95)
	p50 := p95
	if u.DutyCycleP50MilliPercent != nil {
		p50 = min(clampMilliPercent(*u.DutyCycleP50MilliPercent), p95)
	}
	compute := r.RequestHeadroom.add(p50)
	var why []string

	peak, err := quantityBytes(u.PeakMemory, "peakMemory")
	memory := int64(0)
	if err == nil && peak > 0 {
		memory = max(roundUp(peak+ceilDiv(peak, memoryMarginDivisor)+memoryMarginFixed, memoryStep), memoryStep)
		why = append(why, fmt.Sprintf("memory %s from a peak of %s", bytesText(memory), bytesText(peak)))
	}
	var raised []prismv1alpha1.ShareResource
	var raisedWhy []string
	if u.Exceeded != nil && u.Share != nil && memory > 0 {
		for _, res := range u.Exceeded.Resources {
			switch res {
			case prismv1alpha1.ShareResourceCompute:
				if g := int64(u.Share.ComputePercent); g > 0 {
					burst = min(max(burst, roundUp(g*exceededFactor, computeStepPercent)), gpuv1alpha1.MaxComputePercent)
					raisedWhy = append(raisedWhy, fmt.Sprintf("compute peak at least twice the %d%% cap the last run outgrew", g))
					raised = append(raised, res)
				}
			case prismv1alpha1.ShareResourceMemory:
				if g, err := quantityBytes(u.Share.Memory, "share.memory"); err == nil && g > 0 {
					memory = max(memory, roundUp(g*exceededFactor, memoryStep))
					raisedWhy = append(raisedWhy, fmt.Sprintf("memory at least twice the %s the last run outgrew", bytesText(g)))
					raised = append(raised, res)
				}
			}
		}
	}
	compute = min(max(compute, roundUp(ceilDiv(burst, gpuv1alpha1.MaxComputeLimitFactor), computeStepPercent)), burst)
	computeWhy := fmt.Sprintf("compute %d%% from a p95 duty cycle of %s", compute, milliPercent(p95))
	if compute < burst {
		computeWhy = fmt.Sprintf("compute %d%% from a p50 duty cycle of %s, up to %d%% from a p95 of %s", compute, milliPercent(p50), burst, milliPercent(p95))
	}
	why = append([]string{computeWhy}, why...)
	share := gpuv1alpha1.Share{ComputePercent: int32(compute), MemoryBytes: memory}
	s := ShareSize{Verdict: ShareSized, Share: share, ComputePeakPercent: int32(burst), Raised: raised}
	switch {
	case err != nil:
		s.Verdict, s.Raised, s.Reason = ShareNoPeakMemory, nil, "peak memory unusable: "+err.Error()
	case peak == 0:
		s.Verdict, s.Raised, s.Reason = ShareNoPeakMemory, nil, "no peak memory measured: memory is what a share pins, so it is not guessed"
	default:
		s.Reason = strings.Join(append(why, raisedWhy...), "; ")
	}
	if compute >= r.HeavyPercent && (s.Verdict == ShareSized || peak == 0 && err == nil) {
		s.Verdict, s.Reason = ShareHeavy, fmt.Sprintf("%s; %d%% or more of a GPU keeps a whole one", strings.Join(append(why, raisedWhy...), "; "), r.HeavyPercent)
	}
	return s
}

// clampMilliPercent keeps a duty cycle of the status, which a user with
// write access to it could set to anything, within 0 to 100 %.
func clampMilliPercent(m int32) int64 { return min(max(int64(m), 0), 100_000) }

// UsageSummary is the measured use a share is sized from, for people:
// "duty cycle p50 20% p95 32%, peak memory 6Gi, 3 runs on NVIDIA L4".
func UsageSummary(u *prismv1alpha1.UsageProfile) string {
	if u == nil {
		return ""
	}
	var parts []string
	var duty []string
	if p := u.DutyCycleP50MilliPercent; p != nil {
		duty = append(duty, "p50 "+milliPercent(int64(*p)))
	}
	if p := u.DutyCycleP95MilliPercent; p != nil {
		duty = append(duty, "p95 "+milliPercent(int64(*p)))
	}
	if len(duty) > 0 {
		parts = append(parts, "duty cycle "+strings.Join(duty, " "))
	}
	if peak, err := quantityBytes(u.PeakMemory, "peakMemory"); err == nil && peak > 0 {
		parts = append(parts, "peak memory "+bytesText(peak))
	}
	if p := u.SMActivityMilliPercent; p != nil {
		parts = append(parts, "SM activity "+milliPercent(int64(*p)))
	}
	if p := u.DRAMActivityMilliPercent; p != nil {
		parts = append(parts, "DRAM activity "+milliPercent(int64(*p)))
	}
	runs := fmt.Sprintf("%d runs", u.Runs)
	if u.Runs == 1 {
		runs = "1 run"
	}
	if u.ProductName != "" {
		runs += " on " + truncateName(u.ProductName)
	}
	parts = append(parts, runs)
	if e := u.Exceeded; e != nil && len(e.Resources) > 0 {
		names := make([]string, len(e.Resources))
		for i, r := range e.Resources {
			names[i] = strings.ToLower(string(r))
		}
		slices.Sort(names)
		parts = append(parts, "the last run outgrew its "+strings.Join(names, " and "))
	}
	return strings.Join(parts, ", ")
}

// quantityBytes reads a quantity of the status, which the kubelet plugin
// writes but a user with write access to the status could too: never Cmp
// or Value on it (see prismv1alpha1.BoundedValue).
func quantityBytes(q *resource.Quantity, name string) (int64, error) {
	if q == nil {
		return 0, nil
	}
	v, err := prismv1alpha1.BoundedValue(field.NewPath("status", "usage", name), *q, prismv1alpha1.MaxDeviceMemory)
	if err != nil {
		return 0, err
	}
	return v, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func roundUp(v, step int64) int64 { return ceilDiv(v, step) * step }

// milliPercent is "32%" or "32.5%".
func milliPercent(m int64) string {
	if m%1000 == 0 {
		return fmt.Sprintf("%d%%", m/1000)
	}
	return strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", float64(m)/1000), "0"), ".") + "%"
}

// bytesText is "6Gi" for whole GiB and whole MiB ("6451Mi"), rounded up,
// otherwise: a measured peak is rarely round.
func bytesText(b int64) string {
	if b%(1<<30) == 0 {
		return fmt.Sprintf("%dGi", b>>30)
	}
	return fmt.Sprintf("%dMi", ceilDiv(b, 1<<20))
}

// ShareTierName is the subrequest of a rewritten request that asks for the
// share.
const ShareTierName = "share"

// ShareFromUsage lets Rewrite offer a request for one whole GPU a share of
// a GPU first, sized from the profile's usage (SizeShare): a subrequest
// with capacity requests on gpu.prism.dev/compute and gpu.prism.dev/memory,
// which only GPUs published shareable grant. The whole-GPU ladder follows
// it and still ends in fits, so the pod is never less schedulable. Use it
// only where DRAConsumableCapacity is on in the API server and the
// scheduler (what MemoryFloorAsCapacity needs): without it the API server
// drops the capacity requests, and the share subrequest would take a whole
// GPU. Where a fleet is given, a fleet without a shareable GPU that can
// hold the share gets no share tier.
func ShareFromUsage() Option {
	return optionFunc(func(c *Cluster) { c.Capacity.Shares = true })
}

// shareStep decides the share the profile gets, if the caller offers
// shares: the share tier, or nil and why not in the plan. size is the
// profile's usage sized by SizeShare.
func (c Cluster) shareStep(p Profile, size ShareSize) (*tier, *SharePlan) {
	if !c.Capacity.Shares {
		return nil, nil
	}
	plan := &SharePlan{Usage: UsageSummary(p.Usage)}
	if p.Exclusive {
		plan.Verdict, plan.Reason = ShareOptedOut.String(), "the profile's spec.sharing is "+string(prismv1alpha1.SharingExclusive)
		return nil, plan
	}
	if size.Verdict == ShareSized && size.ComputePeakPercent > size.Share.ComputePercent && !c.capsOnlyWhenAsked() {
		// A plugin from before compute caps holds a share to its request,
		// so the share is counted at its peak.
		size.Share.ComputePercent = size.ComputePeakPercent
		size.Reason += fmt.Sprintf("; counted at its peak, %d%%, since not every shareable GPU's kubelet plugin leaves a share's SMs uncapped", size.ComputePeakPercent)
		if int64(size.Share.ComputePercent) >= HeavyComputePercent {
			size.Verdict = ShareHeavy
			size.Reason += fmt.Sprintf("; %d%% or more of a GPU keeps a whole one", HeavyComputePercent)
		}
	}
	plan.Verdict, plan.Reason = size.Verdict.String(), size.Reason
	if size.Verdict != ShareSized {
		return nil, plan
	}
	if c.FleetKnown {
		if why := c.Fleet.shareableFor(size.Share); why != "" {
			plan.Verdict, plan.Reason = ShareNoShareableGPU.String(), size.Reason+"; but "+why
			return nil, plan
		}
	}
	plan.ComputePercent = int64(size.Share.ComputePercent)
	plan.Memory = ptr.To(size.Share.Memory())
	if size.ComputePeakPercent > size.Share.ComputePercent {
		plan.ComputePeakPercent = int64(size.ComputePeakPercent)
	}
	return &tier{name: ShareTierName, share: &size.Share, reason: size.Share.String() + " of a shareable GPU, sized from the profile's usage"}, plan
}

// capsOnlyWhenAsked says whether a share's SMs are left uncapped, unless
// its config asks for a cap: every GPU the fleet publishes shareable says
// so of its kubelet plugin (gpuv1alpha1.ComputeLimitsAttribute). A plugin
// from before compute caps holds every share to its request; without a
// fleet view nothing is known.
func (c Cluster) capsOnlyWhenAsked() bool {
	if !c.FleetKnown || c.Fleet == nil {
		return false
	}
	shared, granted := 0, 0
	for _, m := range c.Fleet.Models {
		shared += m.SharedDevices
		granted += m.ComputeLimitDevices
	}
	return shared > 0 && granted >= shared
}

// shareableFor says why no GPU of the fleet can grant s, or "".
func (f *Fleet) shareableFor(s gpuv1alpha1.Share) string {
	shared, large := 0, 0
	if f != nil {
		for _, m := range f.Models {
			shared += m.SharedDevices
			if m.SharedDevices > 0 && (m.MemoryBytes == 0 || m.MemoryBytes >= s.MemoryBytes) {
				large += m.SharedDevices
			}
		}
	}
	switch {
	case shared == 0:
		return "no GPU is published shareable (the kubelet plugin's --consumable-capacity)"
	case large == 0:
		m := s.Memory()
		return fmt.Sprintf("none of the %d GPUs published shareable has %s of memory", shared, m.String())
	}
	return ""
}

// shareIneligible says why a request keeps whole GPUs although the profile
// got a share, or "", and whether that is the user's choice. A share is one
// GPU's, so a request for more keeps its GPUs; amounts the user wrote are
// the user's.
func (s sharingChoices) shareIneligible(e *resourceapi.ExactDeviceRequest, request string) (why string, optedOut bool) {
	switch {
	case e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount || e.Count > 1:
		return "asks for more than one GPU; a share is a part of one", false
	case e.Capacity != nil && len(e.Capacity.Requests) > 0:
		return "names its own capacity amounts, which are kept", false
	case s.exclusive[request]:
		return "its GpuConfig sets sharing.strategy " + string(gpuv1alpha1.ExclusiveSharing), true
	case s.noShare[request]:
		return "its GpuConfig sets a sharing strategy that a share cannot take", true
	}
	return "", false
}
