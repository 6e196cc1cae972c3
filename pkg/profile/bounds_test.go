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
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/api/prism/v1alpha1/crdtest"
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
	// And in the shares of GPU time, classified launch by launch: the
	// late kernel is compute-bound, the others memory-bound, half the
	// time each, which the tie rule makes Balanced.
	wantShares := v1alpha1.BoundTimeShares{ComputeBoundMilliPercent: 50_000, MemoryBoundMilliPercent: 50_000}
	if diff := cmp.Diff(&wantShares, st.BoundTimeShares); diff != "" || st.BoundType != v1alpha1.BoundTypeBalanced {
		t.Errorf("class %s, shares (-want +got):\n%s", st.BoundType, diff)
	}
	var names []string
	for _, k := range st.TopKernels {
		names = append(names, k.Name)
	}
	if diff := cmp.Diff([]string{"k0", "k1", "k10", "k100", "k1000"}, names); diff != "" {
		t.Errorf("top kernels (-want +got):\n%s", diff)
	}
}

// TestStatusFitsTheCRD: every string the summary fills from the report or
// the caller is held to the CRD's limits, and what does not fit is left
// out with a logged reason rather than costing the whole status. A 105-byte
// ncu version once made the API server refuse each of ten publishes, and
// the profile was lost.
func TestStatusFitsTheCRD(t *testing.T) {
	long := "2025." + strings.Repeat("1", 100)
	withVersion := func(v string) string { return "Nsight Compute version " + v + "\n" + oneLaunch }
	withDevice := func(device, cc string) string {
		return `"ID","Kernel Name","Device","CC","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"` + "\n" +
			`"0","a","` + device + `","` + cc + `","10","50","50"` + "\n"
	}
	for _, tc := range []struct {
		name   string
		report string
		opts   Options
		want   v1alpha1.WorkloadProfileStatus // the fields compared
		// wantLog is what the log must say of what was left out.
		wantLog string
	}{
		{name: "the report's version", report: withVersion("2025.2.1.0"), want: v1alpha1.WorkloadProfileStatus{NCUVersion: "2025.2.1.0"}},
		{
			name: "a version of 105 bytes in the report", report: withVersion(long),
			wantLog: `Leaving out an ncu version longer than the API allows from="the report"`,
		},
		{
			name: "a version of 105 bytes in the report, the caller's instead", report: withVersion(long), opts: Options{NCUVersion: "2025.3.0"},
			want: v1alpha1.WorkloadProfileStatus{NCUVersion: "2025.3.0"}, wantLog: "bytes=105",
		},
		{
			name: "a version of 105 bytes from the caller", report: oneLaunch, opts: Options{NCUVersion: long},
			wantLog: `Leaving out an ncu version longer than the API allows from="the caller"`,
		},
		{name: "the longest version", report: oneLaunch, opts: Options{NCUVersion: strings.Repeat("9", 64)}, want: v1alpha1.WorkloadProfileStatus{NCUVersion: strings.Repeat("9", 64)}},
		{
			name: "a device name of 300 bytes in the report", report: withDevice(strings.Repeat("H", 300), "9.0"),
			want: v1alpha1.WorkloadProfileStatus{Device: &v1alpha1.ProfiledDevice{ProductName: strings.Repeat("H", 256), ComputeCapability: "9.0"}},
		},
		{
			// Cut at a character: "é" is two bytes.
			name: "a device name of 300 characters from the caller", report: oneLaunch, opts: Options{Device: v1alpha1.ProfiledDevice{ProductName: strings.Repeat("é", 300)}},
			want: v1alpha1.WorkloadProfileStatus{Device: &v1alpha1.ProfiledDevice{ProductName: strings.Repeat("é", 128)}},
		},
		{
			name: "a compute capability that is not major.minor", report: withDevice("NVIDIA H100", "9.0.1"),
			want:    v1alpha1.WorkloadProfileStatus{Device: &v1alpha1.ProfiledDevice{ProductName: "NVIDIA H100"}},
			wantLog: `Leaving out a compute capability that is not major.minor computeCapability="9.0.1"`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			opts := tc.opts
			opts.ObservedAt = observedAt
			st, err := FromReport(klog.NewContext(t.Context(), logger), strings.NewReader(tc.report), opts)
			if err != nil {
				t.Fatal(err)
			}
			if errs := crdtest.NewValidator(t).ValidateStatus(t, st); len(errs) > 0 {
				t.Errorf("the API server would refuse the status: %v", errs.ToAggregate())
			}
			got := v1alpha1.WorkloadProfileStatus{NCUVersion: st.NCUVersion, Device: st.Device}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			if log := logger.GetSink().(ktesting.Underlier).GetBuffer().String(); !strings.Contains(log, tc.wantLog) {
				t.Errorf("log does not say %q:\n%s", tc.wantLog, log)
			}
		})
	}
}
