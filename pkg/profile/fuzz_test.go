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
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/prismgpu/prism/api/prism/v1alpha1/crdtest"
	"github.com/prismgpu/prism/pkg/ncu/ncutest"
)

// oneLaunch is the shortest raw report with a launch.
const oneLaunch = `"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"0","a","10","50","50"
`

// FuzzFromReport feeds whatever the parser accepts through the summary, so
// that odd but parseable reports (zero durations, one kernel with no GPU
// time among others) cannot make it panic or leave the API's ranges. Every
// status is checked against the CRD as the API server checks it: one it
// would refuse is a profile lost.
func FuzzFromReport(f *testing.F) {
	crd := crdtest.NewValidator(f)
	ncutest.AddFixtures(f, filepath.Join("..", "ncu", "testdata"))
	f.Add([]byte(`"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"0","a","0","150","-5"
"1","b","10","50","50"
`))
	// Durations that overflowed the weights into Inf and NaN.
	f.Add([]byte(`"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","dram__bytes.sum","lts__throughput.avg.pct_of_peak_sustained_elapsed"
"","","second","%","%","byte","%"
"0","a","1e308","50","50","1e300","50"
"1","b","86400","50","50","1e24","50"
`))
	// A version of 105 bytes, which the CRD's 64 refused: the publish was
	// tried ten times and the profile lost.
	f.Add([]byte("Nsight Compute version 2025." + strings.Repeat("1", 100) + "\n" + oneLaunch))
	// A device name beyond the CRD's 256 bytes and a compute capability
	// that is not "major.minor", both from the report.
	f.Add([]byte(`"ID","Kernel Name","Device","CC","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"0","a","` + strings.Repeat("H", 300) + `","9.0.1","10","50","50"
`))
	f.Fuzz(func(t *testing.T, in []byte) {
		st, err := FromReport(context.Background(), bytes.NewReader(in), Options{ObservedAt: time.Unix(0, 0)})
		if err != nil {
			return
		}
		if errs := crd.ValidateStatus(t, st); len(errs) > 0 {
			t.Fatalf("the API server would refuse the status: %v", errs.ToAggregate())
		}
		percents := []*int32{st.SMThroughputMilliPercent, st.MemoryThroughputMilliPercent, st.DRAMThroughputMilliPercent,
			st.L2ThroughputMilliPercent, st.AchievedOccupancyMilliPercent}
		if sh := st.BoundTimeShares; sh != nil {
			percents = append(percents, &sh.ComputeBoundMilliPercent, &sh.MemoryBoundMilliPercent, &sh.LatencyBoundMilliPercent, &sh.BalancedMilliPercent)
			if c := ClassifyShares(*sh); c != st.BoundType {
				t.Fatalf("ClassifyShares(%+v) = %s, status says %s", *sh, c, st.BoundType)
			}
		} else if st.KernelLaunches > 0 {
			t.Fatalf("no boundTimeShares for %d launches", st.KernelLaunches)
		}
		for _, k := range st.TopKernels {
			percents = append(percents, &k.TimeShareMilliPercent, &k.SMThroughputMilliPercent, &k.MemoryThroughputMilliPercent)
			if k.Launches < 1 || len(k.Name) > maxKernelName {
				t.Fatalf("top kernel out of range: %+v", k)
			}
		}
		for _, p := range percents {
			if p != nil && (*p < 0 || *p > 100_000) {
				t.Fatalf("milli-percent %d out of range", *p)
			}
		}
		for _, q := range []*resource.Quantity{st.WavesPerSM, st.DRAMBytes, st.FLOPs, st.ArithmeticIntensity} {
			if q != nil && q.Sign() < 0 {
				t.Fatalf("negative quantity %s", q)
			}
		}
		if len(st.TopKernels) > maxTopKernels || st.KernelLaunches < 0 || st.TotalGPUTimeNanoseconds < 0 {
			t.Fatalf("status out of range: %+v", st)
		}
		if st.BoundType == "" {
			t.Fatalf("no bound type")
		}
	})
}
