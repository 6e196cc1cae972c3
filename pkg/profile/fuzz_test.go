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
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/prismgpu/prism/pkg/ncu/ncutest"
)

// FuzzFromReport feeds whatever the parser accepts through the summary, so
// that odd but parseable reports (zero durations, one kernel with no GPU
// time among others) cannot make it panic or leave the API's ranges.
func FuzzFromReport(f *testing.F) {
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
	f.Fuzz(func(t *testing.T, in []byte) {
		st, err := FromReport(context.Background(), bytes.NewReader(in), Options{ObservedAt: time.Unix(0, 0)})
		if err != nil {
			return
		}
		percents := []*int32{st.SMThroughputMilliPercent, st.MemoryThroughputMilliPercent, st.DRAMThroughputMilliPercent,
			st.L2ThroughputMilliPercent, st.AchievedOccupancyMilliPercent}
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
