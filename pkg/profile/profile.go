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
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/ncu"
)

const (
	defaultTopKernels = 5
	maxTopKernels     = 10  // the API's MaxItems
	maxKernelName     = 512 // the API's MaxLength
)

// Options say what the report itself cannot.
type Options struct {
	// NCUVersion is recorded when the report does not carry the version.
	NCUVersion string
	// Device fields that are set replace what the report says. The report
	// holds the device's index, not its product name; the kubelet plugin
	// knows the name from NVML.
	Device v1alpha1.ProfiledDevice
	// PeakFLOPS (FP32, per second) and PeakDRAMBytesPerSecond place the
	// roofline's ridge point. When either is zero both are looked up by
	// product name in a table of common data-centre GPUs.
	PeakFLOPS              float64
	PeakDRAMBytesPerSecond float64
	// PeakMemory is the most device memory the workload held, from NVML.
	PeakMemory *resource.Quantity
	// Source is recorded as the status's source.
	Source *v1alpha1.ProfileSource
	// Report identifies the raw report, when the caller has it.
	Report *v1alpha1.ReportDigest
	// ObservedAt is recorded as the observation time; zero means now.
	ObservedAt time.Time
	// TopKernels is how many kernels to list, 5 when zero, at most 10.
	TopKernels int
}

// FromReport parses an ncu CSV report in either layout and summarises it.
func FromReport(ctx context.Context, r io.Reader, opts Options) (v1alpha1.WorkloadProfileStatus, error) {
	rep, err := ncu.Parse(ctx, r)
	if err != nil {
		return v1alpha1.WorkloadProfileStatus{}, fmt.Errorf("parsing ncu report: %w", err)
	}
	return Summarize(ctx, rep, opts), nil
}

// ForClaim builds the status for a report the kubelet plugin collected
// from a container that ran with the given ResourceClaim. It talks to no
// API server: the plugin writes the result with Apply and the status
// subresource.
func ForClaim(ctx context.Context, claim v1alpha1.ClaimReference, report []byte, opts Options) (v1alpha1.WorkloadProfileStatus, error) {
	opts.Source = &v1alpha1.ProfileSource{Type: v1alpha1.ProfileSourceResourceClaim, ResourceClaim: &claim}
	st, err := FromReport(klog.NewContext(ctx, klog.FromContext(ctx).WithValues("claim", klog.KRef(claim.Namespace, claim.Name))), bytes.NewReader(report), opts)
	if err != nil {
		return st, fmt.Errorf("profile of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return st, nil
}

// Apply writes a fresh status into a WorkloadProfile. It replaces every
// measured field and merges the conditions, so that a condition whose
// status did not change keeps its transition time. The roofline verdict is
// a measurement too: one the new status lacks is removed.
func Apply(wp *v1alpha1.WorkloadProfile, st v1alpha1.WorkloadProfileStatus) {
	conditions := wp.Status.Conditions
	wp.Status = *st.DeepCopy()
	wp.Status.Conditions = conditions
	if meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRooflineConsistent) == nil {
		meta.RemoveStatusCondition(&wp.Status.Conditions, v1alpha1.ConditionRooflineConsistent)
	}
	for _, c := range st.Conditions {
		c.ObservedGeneration = wp.Generation
		meta.SetStatusCondition(&wp.Status.Conditions, c)
	}
}

// mean is a weighted mean that knows whether anything was added.
type mean struct{ sum, weight float64 }

func (m *mean) add(v, w float64) {
	m.sum += v * w
	m.weight += w
}

func (m mean) value() (float64, bool) {
	if m.weight == 0 {
		return 0, false
	}
	return m.sum / m.weight, true
}

type kernel struct {
	name       string
	launches   int32
	gpuTime    float64
	sm, memory mean
}

// Summarize aggregates a parsed report into a status. Launches are
// weighted by GPU time, so that a kernel running most of the time dominates
// the class; a metric measured on only some launches is averaged over
// those.
func Summarize(ctx context.Context, rep *ncu.Report, opts Options) v1alpha1.WorkloadProfileStatus {
	logger := klog.FromContext(ctx)
	observedAt := opts.ObservedAt
	if observedAt.IsZero() {
		observedAt = time.Now()
	}
	st := v1alpha1.WorkloadProfileStatus{
		BoundType:  v1alpha1.BoundTypeUnknown,
		NCUVersion: rep.Version,
		ObservedAt: &metav1.Time{Time: observedAt},
		Source:     opts.Source,
		Report:     opts.Report,
		PeakMemory: opts.PeakMemory,
	}
	if st.NCUVersion == "" {
		st.NCUVersion = opts.NCUVersion
	}
	st.Device = device(rep, opts.Device)
	now := metav1.NewTime(observedAt)

	if len(rep.Launches) == 0 {
		st.Conditions = []metav1.Condition{{
			Type: v1alpha1.ConditionProfiled, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNoKernels,
			Message: "the ncu report holds no kernel launches", LastTransitionTime: now,
		}}
		return st
	}

	var total float64
	for _, l := range rep.Launches {
		total += l.Metrics[ncu.MetricDuration]
	}
	// All-zero durations would weigh nothing; count launches equally then.
	weight := func(l *ncu.Launch) float64 {
		if total == 0 {
			return 1
		}
		return l.Metrics[ncu.MetricDuration]
	}

	var sm, memory, dram, l2, occupancy, waves mean
	var flops, dramBytes, rooflineFLOPs, rooflineBytes float64
	var haveFLOPs, haveBytes bool
	kernels := map[string]*kernel{}
	for i := range rep.Launches {
		l := &rep.Launches[i]
		w := weight(l)
		for _, m := range []struct {
			acc    *mean
			metric string
		}{
			{&sm, ncu.MetricSMThroughput},
			{&memory, ncu.MetricMemoryThroughput},
			{&dram, ncu.MetricDRAMThroughput},
			{&l2, ncu.MetricL2Throughput},
			{&occupancy, ncu.MetricAchievedOccupancy},
			{&waves, ncu.MetricWavesPerSM},
		} {
			if v, ok := l.Metric(m.metric); ok {
				m.acc.add(v, w)
			}
		}
		f, okF := l.FLOPs()
		b, okB := l.DRAMBytes()
		if okF {
			flops, haveFLOPs = flops+f, true
		}
		if okB {
			dramBytes, haveBytes = dramBytes+b, true
		}
		// The intensity only counts launches where both were measured,
		// or a launch without FLOP counts would look memory-bound.
		if okF && okB {
			rooflineFLOPs += f
			rooflineBytes += b
		}

		k := kernels[l.Kernel]
		if k == nil {
			k = &kernel{name: l.Kernel}
			kernels[l.Kernel] = k
		}
		k.launches++
		k.gpuTime += l.Metrics[ncu.MetricDuration]
		k.sm.add(l.Metrics[ncu.MetricSMThroughput], w)
		k.memory.add(l.Metrics[ncu.MetricMemoryThroughput], w)
	}

	st.SMThroughputMilliPercent = milliPercent(sm)
	st.MemoryThroughputMilliPercent = milliPercent(memory)
	st.DRAMThroughputMilliPercent = milliPercent(dram)
	st.L2ThroughputMilliPercent = milliPercent(l2)
	st.AchievedOccupancyMilliPercent = milliPercent(occupancy)
	st.SMThroughput = formatPercent(st.SMThroughputMilliPercent)
	st.MemoryThroughput = formatPercent(st.MemoryThroughputMilliPercent)
	st.AchievedOccupancy = formatPercent(st.AchievedOccupancyMilliPercent)
	if v, ok := waves.value(); ok {
		st.WavesPerSM = resource.NewMilliQuantity(clampInt64(v*1000), resource.DecimalSI)
	}
	if haveBytes {
		st.DRAMBytes = resource.NewQuantity(clampInt64(dramBytes), resource.DecimalSI)
	}
	if haveFLOPs {
		st.FLOPs = resource.NewQuantity(clampInt64(flops), resource.DecimalSI)
	}
	if rooflineFLOPs > 0 && rooflineBytes > 0 {
		st.ArithmeticIntensity = resource.NewMilliQuantity(clampInt64(rooflineFLOPs/rooflineBytes*1000), resource.DecimalSI)
	}
	st.KernelLaunches = int32(min(len(rep.Launches), math.MaxInt32))
	st.TotalGPUTimeNanoseconds = clampInt64(total)
	st.TopKernels = topKernels(kernels, total, opts.TopKernels)
	// ncu.Parse guarantees both throughputs on every launch; a Report
	// built by hand might not have them.
	smMilli, memMilli := ptrOrZero(st.SMThroughputMilliPercent), ptrOrZero(st.MemoryThroughputMilliPercent)
	if st.SMThroughputMilliPercent != nil && st.MemoryThroughputMilliPercent != nil {
		st.BoundType = Classify(smMilli, memMilli)
	}

	msg := fmt.Sprintf("%s of %s, %s of GPU time: SM %s, memory %s",
		count(int(st.KernelLaunches), "launch", "launches"), count(len(kernels), "kernel", "kernels"),
		time.Duration(st.TotalGPUTimeNanoseconds), FormatMilliPercent(smMilli), FormatMilliPercent(memMilli))
	if v, ok := waves.value(); ok && v < 1 {
		msg += fmt.Sprintf("; %.2f waves per SM, so the grids do not fill the GPU", v)
	}
	if rep.Dropped > 0 {
		msg += fmt.Sprintf("; %s without a duration or throughput left out", count(rep.Dropped, "launch", "launches"))
	}
	peakFLOPS, peakBandwidth := opts.PeakFLOPS, opts.PeakDRAMBytesPerSecond
	product := ""
	if st.Device != nil {
		product = st.Device.ProductName
	}
	if peakFLOPS <= 0 || peakBandwidth <= 0 {
		peakFLOPS, peakBandwidth, _ = peaksOf(product)
	}
	st.Conditions = []metav1.Condition{{
		Type: v1alpha1.ConditionProfiled, Status: metav1.ConditionTrue, Reason: v1alpha1.ReasonReportParsed,
		Message: msg, LastTransitionTime: now,
	}}
	rc, judged := roofline(st.BoundType, rooflineFLOPs, rooflineBytes, peakFLOPS, peakBandwidth)
	if judged {
		rc.LastTransitionTime = now
		st.Conditions = append(st.Conditions, rc)
	}
	logger.V(2).Info("Summarised ncu report", "boundType", st.BoundType, "launches", st.KernelLaunches,
		"kernels", len(kernels), "roofline", rc.Reason, "rooflineMessage", rc.Message)
	return st
}

// device merges what the report says about the device with what the caller
// knows better.
func device(rep *ncu.Report, override v1alpha1.ProfiledDevice) *v1alpha1.ProfiledDevice {
	d := override
	if len(rep.Launches) > 0 {
		l := rep.Launches[0]
		if d.ComputeCapability == "" {
			d.ComputeCapability = l.ComputeCapability
		}
		// ncu's Device column is an index; only a name is worth keeping.
		if _, err := strconv.Atoi(l.Device); d.ProductName == "" && err != nil {
			d.ProductName = l.Device
		}
	}
	if d == (v1alpha1.ProfiledDevice{}) {
		return nil
	}
	return &d
}

func topKernels(kernels map[string]*kernel, total float64, n int) []v1alpha1.KernelSummary {
	if n <= 0 {
		n = defaultTopKernels
	}
	n = min(n, maxTopKernels, len(kernels))
	sorted := make([]*kernel, 0, len(kernels))
	for _, k := range kernels {
		sorted = append(sorted, k)
	}
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].gpuTime != sorted[j].gpuTime {
			return sorted[i].gpuTime > sorted[j].gpuTime
		}
		return sorted[i].name < sorted[j].name
	})
	var launches int32
	for _, k := range kernels {
		launches += k.launches
	}
	out := make([]v1alpha1.KernelSummary, 0, n)
	for _, k := range sorted[:n] {
		share := float64(k.launches) / float64(launches)
		if total > 0 {
			share = k.gpuTime / total
		}
		out = append(out, v1alpha1.KernelSummary{
			Name:                         truncate(k.name, maxKernelName),
			Launches:                     k.launches,
			TimeShareMilliPercent:        toMilliPercent(share * 100),
			SMThroughputMilliPercent:     ptrOrZero(milliPercent(k.sm)),
			MemoryThroughputMilliPercent: ptrOrZero(milliPercent(k.memory)),
		})
	}
	return out
}

func ptrOrZero(p *int32) int32 {
	if p == nil {
		return 0
	}
	return *p
}

func milliPercent(m mean) *int32 {
	v, ok := m.value()
	if !ok {
		return nil
	}
	p := toMilliPercent(v)
	return &p
}

// toMilliPercent rounds a percentage to milli-percent, clamped to the API's
// range: ncu can print a hair over 100 % for a saturated unit.
func toMilliPercent(p float64) int32 {
	return int32(math.Round(math.Max(0, math.Min(100, p)) * 1000))
}

func clampInt64(v float64) int64 {
	switch {
	case v >= math.MaxInt64:
		return math.MaxInt64
	case v <= 0:
		return 0
	}
	return int64(math.Round(v))
}

// truncate shortens to at most n bytes without splitting a UTF-8 sequence.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func count(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.Itoa(n) + " " + many
}

// formatPercent is the column people read: one decimal, "20.9%". It is
// empty when the value is, so that kubectl prints <none> as it did for
// the integer.
func formatPercent(v *int32) string {
	if v == nil {
		return ""
	}
	// In integers, so that 87.55 % rounds up as a person would.
	tenths := (*v + 50) / 100
	return fmt.Sprintf("%d.%d%%", tenths/10, tenths%10)
}

// FormatMilliPercent prints milli-percent as a percentage, "87.5%".
func FormatMilliPercent(v int32) string {
	return strconv.FormatFloat(float64(v)/1000, 'f', -1, 64) + "%"
}
