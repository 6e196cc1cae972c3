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

package sim

import (
	"math"

	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// ReferenceProduct is the GPU trace runtimes are measured on.
const ReferenceProduct = "NVIDIA A100-SXM4-40GB"

// LatencyExponent is how much of the FP32 ratio a latency-bound job sees:
// launch overheads, host round trips and synchronisation dominate it, and
// those barely improve on a bigger GPU.
const LatencyExponent = 0.1

var reference = func() gpu.Spec {
	s, ok := gpu.LookupSpec(ReferenceProduct)
	if !ok {
		panic("sim: reference GPU " + ReferenceProduct + " missing from the spec table")
	}
	return s
}()

// Speed is how many times faster than on the reference GPU a job runs on
// a GPU with spec g (see docs/simulator.md):
//
//   - memory-bound: bandwidth ratio rm = BW(g)/BW(ref)
//   - compute-bound: FP32 ratio rc = FLOPS(g)/FLOPS(ref)
//   - latency-bound: rc^0.1
//   - balanced and unknown: sqrt(rc*rm)
//
// When the job has measured SM and memory throughput (percent of peak,
// HasUtil), they decide the exponents instead of the bound type: with
// a = sm/100, b = mem/100 and u = max(a, b), speed =
// rc^(u*a/(a+b) + 0.1*(1-u)) * rm^(u*b/(a+b)); the four cases above are
// its corners (a=1,b=0; a=0,b=1; a=b=0; a=b=1).
func Speed(j *Job, g gpu.Spec) float64 {
	rc := g.FP32TFLOPS / reference.FP32TFLOPS
	rm := float64(g.BandwidthGBps) / float64(reference.BandwidthGBps)
	if j.HasUtil {
		a := clamp01(j.SMPct / 100)
		b := clamp01(j.MemPct / 100)
		u := max(a, b)
		ec, em := LatencyExponent, 0.0
		if u > 0 {
			ec = u*a/(a+b) + LatencyExponent*(1-u)
			em = u * b / (a + b)
		}
		return math.Pow(rc, ec) * math.Pow(rm, em)
	}
	switch j.Bound {
	case rewrite.MemoryBound:
		return rm
	case rewrite.ComputeBound:
		return rc
	case rewrite.LatencyBound:
		return math.Pow(rc, LatencyExponent)
	default:
		return math.Sqrt(rc * rm)
	}
}

func clamp01(x float64) float64 {
	return math.Min(1, math.Max(0, x))
}
