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
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Thresholds of the speed-of-light rule, in milli-percent.
const (
	latencyBelow = 60_000 // both units below this: latency-bound
	highAtLeast  = 80_000 // either unit at or above this: bound by it
	balancedGap  = 10_000 // closer than this (both below high): balanced
)

// Classify applies NVIDIA's speed-of-light bottleneck rule to one kernel's
// SM and memory throughput, both in milli-percent of peak, as a top
// kernel's are stored. A workload of several kernels is classified by
// ClassifyShares, on the GPU time each class holds: averaging the
// throughputs of a memory-bound and a compute-bound kernel first can put
// both below 60 % and make LatencyBound of a workload none of whose
// kernels is.
func Classify(smMilliPercent, memoryMilliPercent int32) v1alpha1.BoundType {
	c, m := smMilliPercent, memoryMilliPercent
	switch {
	case c < latencyBelow && m < latencyBelow:
		return v1alpha1.BoundTypeLatencyBound
	case c >= highAtLeast || m >= highAtLeast:
		// Either unit saturated: the busier one bounds the workload.
		return larger(c, m)
	case abs(c-m) >= balancedGap:
		return larger(c, m)
	default:
		return v1alpha1.BoundTypeBalanced
	}
}

// larger names the busier unit; an exact tie has no single bottleneck.
func larger(c, m int32) v1alpha1.BoundType {
	switch {
	case c > m:
		return v1alpha1.BoundTypeComputeBound
	case m > c:
		return v1alpha1.BoundTypeMemoryBound
	default:
		return v1alpha1.BoundTypeBalanced
	}
}

// ClassifyShares gives a workload the class of the kernels that hold the
// most of its GPU time, from the shares stored in the status, so that
// anyone re-classifying a stored status gets its boundType. Ties, on the
// stored integers:
//   - ComputeBound and MemoryBound holding the same, largest share is
//     Balanced: each unit bounds as much of the time as the other, as with
//     equal throughputs in Classify;
//   - otherwise a class that keeps a unit busy wins over one that does
//     not: ComputeBound or MemoryBound over Balanced, and Balanced over
//     LatencyBound. Half the time memory-bound and half latency-bound is
//     MemoryBound, since the smaller or shared GPU that LatencyBound
//     invites would slow the memory-bound half.
//
// Shares that are all zero (nothing classified) are Unknown.
func ClassifyShares(s v1alpha1.BoundTimeShares) v1alpha1.BoundType {
	top := max(s.ComputeBoundMilliPercent, s.MemoryBoundMilliPercent, s.BalancedMilliPercent, s.LatencyBoundMilliPercent)
	switch {
	case top <= 0:
		return v1alpha1.BoundTypeUnknown
	case s.ComputeBoundMilliPercent == top && s.MemoryBoundMilliPercent == top:
		return v1alpha1.BoundTypeBalanced
	case s.ComputeBoundMilliPercent == top:
		return v1alpha1.BoundTypeComputeBound
	case s.MemoryBoundMilliPercent == top:
		return v1alpha1.BoundTypeMemoryBound
	case s.BalancedMilliPercent == top:
		return v1alpha1.BoundTypeBalanced
	default:
		return v1alpha1.BoundTypeLatencyBound
	}
}

// sharesOf gives each class's time as milli-percent of total.
func sharesOf(byClass map[v1alpha1.BoundType]float64, total float64) v1alpha1.BoundTimeShares {
	share := func(b v1alpha1.BoundType) int32 {
		if total <= 0 {
			return 0
		}
		return toMilliPercent(byClass[b] / total * 100)
	}
	return v1alpha1.BoundTimeShares{
		ComputeBoundMilliPercent: share(v1alpha1.BoundTypeComputeBound),
		MemoryBoundMilliPercent:  share(v1alpha1.BoundTypeMemoryBound),
		LatencyBoundMilliPercent: share(v1alpha1.BoundTypeLatencyBound),
		BalancedMilliPercent:     share(v1alpha1.BoundTypeBalanced),
	}
}

// describeShares lists the classes that hold GPU time, largest first, for
// the Profiled message: "MemoryBound 75.9%, ComputeBound 22.6%". It is
// empty when one class holds all of it, which the class itself says.
func describeShares(s v1alpha1.BoundTimeShares) string {
	type share struct {
		bound v1alpha1.BoundType
		milli int32
	}
	all := []share{
		{v1alpha1.BoundTypeComputeBound, s.ComputeBoundMilliPercent},
		{v1alpha1.BoundTypeMemoryBound, s.MemoryBoundMilliPercent},
		{v1alpha1.BoundTypeBalanced, s.BalancedMilliPercent},
		{v1alpha1.BoundTypeLatencyBound, s.LatencyBoundMilliPercent},
	}
	held := slices.DeleteFunc(all, func(x share) bool { return x.milli <= 0 })
	if len(held) < 2 {
		return ""
	}
	slices.SortStableFunc(held, func(a, b share) int { return cmp.Compare(b.milli, a.milli) })
	parts := make([]string, len(held))
	for i, x := range held {
		parts[i] = string(x.bound) + " " + FormatMilliPercent(x.milli)
	}
	return strings.Join(parts, ", ")
}

func abs(x int32) int32 {
	if x < 0 {
		return -x
	}
	return x
}

// roofline compares a speed-of-light class with the FP32 roofline. It only
// reports: the class stays what the speed-of-light rule said, because the
// rule sees every unit while the roofline sees FP32 work and DRAM only.
// judged is false when the roofline has nothing to say about this
// workload; the condition's reason and message then say why, for the log.
func roofline(bound v1alpha1.BoundType, flops, dramBytes, peakFLOPS, peakBandwidth float64) (c metav1.Condition, judged bool) {
	c = metav1.Condition{Type: v1alpha1.ConditionRooflineConsistent, Status: metav1.ConditionUnknown}
	switch {
	case bound != v1alpha1.BoundTypeMemoryBound && bound != v1alpha1.BoundTypeComputeBound:
		c.Reason, c.Message = "NotApplicable", "the roofline does not judge "+string(bound)+" workloads"
		return c, false
	case flops <= 0 || dramBytes <= 0:
		// Integer, tensor-core or copy kernels have no FP32 work; the
		// intensity is then 0 or infinite and says nothing.
		c.Reason, c.Message = "NotMeasured", "no launch has both FP32 work and DRAM traffic"
		return c, false
	case peakFLOPS <= 0 || peakBandwidth <= 0:
		c.Reason, c.Message = "NotMeasured", "the device's FP32 peak and DRAM bandwidth are not known"
		return c, false
	}
	ai, ridge := flops/dramBytes, peakFLOPS/peakBandwidth
	memorySide := ai < ridge
	where := fmt.Sprintf("%s FLOP per byte of DRAM traffic, against the device's ridge point of %s", plain(ai), plain(ridge))
	switch {
	case bound == v1alpha1.BoundTypeMemoryBound && memorySide:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonRooflineAgrees
		c.Message = "The FP32 roofline agrees that memory limits this workload: " + where + "."
	case bound == v1alpha1.BoundTypeComputeBound && !memorySide:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonRooflineAgrees
		c.Message = "The FP32 roofline agrees that compute limits this workload: " + where + "."
	case bound == v1alpha1.BoundTypeComputeBound:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees
		c.Message = "The SMs are the busier unit, yet the FP32 roofline puts this workload on the memory side (" + where +
			"). Most of its work is probably not FP32: integer, special-function or tensor-core instructions are not on this roofline."
	default:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees
		c.Message = "Memory is the busier unit, yet the FP32 roofline puts this workload on the compute side (" + where +
			"). The traffic is probably to L1, L2 or shared memory rather than DRAM."
	}
	return c, true
}

// plain prints a ratio with three significant digits and no exponent.
func plain(v float64) string {
	if v >= 100 {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
