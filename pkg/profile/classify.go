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
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Thresholds of the speed-of-light rule, in milli-percent.
const (
	latencyBelow = 60_000 // both units below this: latency-bound
	highAtLeast  = 80_000 // either unit at or above this: bound by it
	balancedGap  = 10_000 // closer than this (both below high): balanced
)

// Classify applies NVIDIA's speed-of-light bottleneck rule to a workload's
// SM and memory throughput, both in milli-percent of peak. It works on the
// integers stored in the API so that anyone re-classifying a stored
// status gets the same answer.
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

func abs(x int32) int32 {
	if x < 0 {
		return -x
	}
	return x
}

// roofline compares a speed-of-light class with the FP32 roofline. It only
// reports: the class stays what the speed-of-light rule said, because the
// rule sees every unit while the roofline sees FP32 work and DRAM only.
func roofline(bound v1alpha1.BoundType, flops, dramBytes, peakFLOPS, peakBandwidth float64, device string) metav1.Condition {
	c := metav1.Condition{Type: v1alpha1.ConditionRooflineConsistent, Status: metav1.ConditionUnknown}
	switch {
	case flops <= 0:
		// Without FP32 work or DRAM traffic the intensity is 0 or
		// infinite and says nothing about the class.
		c.Reason = v1alpha1.ReasonRooflineNotMeasured
		c.Message = "the report has no FP32 work on launches with DRAM traffic; collect the fadd, fmul and ffma instruction metrics (ncu --set roofline) to cross-check"
		return c
	case dramBytes <= 0:
		c.Reason = v1alpha1.ReasonRooflineNotMeasured
		c.Message = "the report has no DRAM bytes on launches with FP32 work; collect dram__bytes.sum to cross-check"
		return c
	case peakFLOPS <= 0 || peakBandwidth <= 0:
		c.Reason = v1alpha1.ReasonRooflineNotMeasured
		c.Message = fmt.Sprintf("the FP32 peak and DRAM bandwidth of device %q are not known", device)
		return c
	}
	ai, ridge := flops/dramBytes, peakFLOPS/peakBandwidth
	memorySide := ai < ridge
	where := fmt.Sprintf("arithmetic intensity %.3g FLOP/byte against a ridge point of %.3g", ai, ridge)
	switch {
	case bound == v1alpha1.BoundTypeMemoryBound && memorySide,
		bound == v1alpha1.BoundTypeComputeBound && !memorySide:
		c.Status, c.Reason = metav1.ConditionTrue, v1alpha1.ReasonRooflineAgrees
		c.Message = where + " agrees with " + string(bound)
	case bound == v1alpha1.BoundTypeComputeBound:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees
		c.Message = where + " is on the memory side, yet the SMs are the busier unit: the work is probably not FP32 (integer, special-function or tensor-core instructions are not on this roofline)"
	case bound == v1alpha1.BoundTypeMemoryBound:
		c.Status, c.Reason = metav1.ConditionFalse, v1alpha1.ReasonRooflineDisagrees
		c.Message = where + " is on the compute side, yet memory is the busier unit: the traffic is probably to L1, L2 or shared memory rather than DRAM"
	default:
		c.Reason = v1alpha1.ReasonRooflineNotApplicable
		c.Message = where + "; the roofline does not judge " + string(bound) + " workloads"
	}
	return c
}
