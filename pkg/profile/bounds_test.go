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
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

const rawHeader = `"ID","Kernel Name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"` + "\n" +
	`"","","second","%","%"` + "\n"

// TestAbsurdDurationsAreRefused: a launch of 1e308 s made the weights Inf
// and NaN, and the milli-percent fields -2147483648, which the CRD then
// refused to store.
func TestAbsurdDurationsAreRefused(t *testing.T) {
	for _, rows := range []string{
		`"0","a","1e308","50","50"` + "\n" + `"1","b","1","50","50"` + "\n",
		`"0","a","1e308","50","50"` + "\n" + `"1","b","1e308","50","50"` + "\n",
	} {
		_, err := FromReport(context.Background(), strings.NewReader(rawHeader+rows), Options{ObservedAt: observedAt})
		if err == nil || !strings.Contains(err.Error(), "out of range") {
			t.Errorf("FromReport(%q) error %v, want the duration out of range", rows, err)
		}
	}
}

// TestKernelNamesAreBounded: the names are the tenant's, one map entry
// each; beyond maxKernels their launches still count but are not ranked.
func TestKernelNamesAreBounded(t *testing.T) {
	var in strings.Builder
	in.WriteString(rawHeader)
	const extra = 10
	for i := range maxKernels + extra {
		fmt.Fprintf(&in, `"%d","k%d","0.001","10","80"`+"\n", i, i)
	}
	// The heaviest kernel comes last, after the map is full: as much GPU
	// time as all the others together.
	fmt.Fprintf(&in, `"x","late-and-heavy","%g","90","10"`+"\n", 0.001*(maxKernels+extra))
	st, err := FromReport(context.Background(), strings.NewReader(in.String()), Options{ObservedAt: observedAt})
	if err != nil {
		t.Fatal(err)
	}
	if st.KernelLaunches != maxKernels+extra+1 {
		t.Errorf("%d launches counted, want %d", st.KernelLaunches, maxKernels+extra+1)
	}
	c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProfiled)
	if c == nil {
		t.Fatal("no Profiled condition")
	}
	for _, want := range []string{fmt.Sprintf("more than %d kernels", maxKernels), fmt.Sprintf("11 launches of kernels beyond the first %d", maxKernels)} {
		if !strings.Contains(c.Message, want) {
			t.Errorf("Profiled message %q does not say %q", c.Message, want)
		}
	}
	// The late kernel weighs in the class: half the GPU time at 90 % SM,
	// half at 10 %.
	if got, want := *st.SMThroughputMilliPercent, int32(50_000); got != want {
		t.Errorf("SM throughput %d milli-percent, want about %d: launches beyond the map must still count", got, want)
	}
	var names []string
	for _, k := range st.TopKernels {
		names = append(names, k.Name)
	}
	if diff := cmp.Diff([]string{"k0", "k1", "k10", "k100", "k1000"}, names); diff != "" {
		t.Errorf("top kernels (-want +got):\n%s", diff)
	}
}
