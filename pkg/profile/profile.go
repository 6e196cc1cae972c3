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
	"io"
	"maps"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	maxTopKernels     = v1alpha1.MaxTopKernels
	maxKernelName     = v1alpha1.MaxKernelNameLength
)

// computeCapability is the API's pattern of a compute capability.
var computeCapability = regexp.MustCompile(v1alpha1.ComputeCapabilityPattern)

// Options say what the report itself cannot.
type Options struct {
	// NCUVersion is recorded when the report does not carry the version.
	NCUVersion string
	// Device fields that are set replace what the report says. The details
	// page holds only the device's index (the raw page of ncu 2025.3 also
	// the product name); the kubelet plugin knows the name from NVML.
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

// FromReport reads an ncu CSV report in either layout and summarises it.
// It reads the report once, as a stream, and holds a bounded summary of it
// (at most maxKernels kernel names), whatever the report's size.
func FromReport(ctx context.Context, r io.Reader, opts Options) (v1alpha1.WorkloadProfileStatus, error) {
	sum := newSummary()
	rep, err := ncu.Scan(ctx, r, sum.add)
	if err != nil {
		return v1alpha1.WorkloadProfileStatus{}, fmt.Errorf("parsing ncu report: %w", err)
	}
	return sum.status(ctx, rep, opts), nil
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

// mean is a mean over launches, weighted by GPU time and, for reports
// whose durations are all zero, by count: which of the two applies is
// known only at the end of the stream.
type mean struct{ timed, time, plain, count float64 }

func (m *mean) add(v, ns float64) {
	m.timed += v * ns
	m.time += ns
	m.plain += v
	m.count++
}

func (m mean) value(byTime bool) (float64, bool) {
	switch {
	case m.count == 0:
		return 0, false
	case byTime && m.time > 0:
		return m.timed / m.time, true
	}
	return m.plain / m.count, true
}

type kernel struct {
	name       string
	launches   int32
	gpuTime    float64
	sm, memory mean
}

// maxKernels bounds the kernel names a summary keeps: the names are the
// tenant's, up to a CSV line each. Launches of kernels beyond it still
// count in every figure; they are only left out of the top kernels, which
// is said in the Profiled message.
const maxKernels = 4096

// summary accumulates the launches Scan passes on. Launches are weighted
// by GPU time, so that a kernel running most of the time dominates the
// class; a metric measured on only some launches is averaged over those.
type summary struct {
	launches                               int
	total                                  float64
	sm, memory, dram, l2, occupancy, waves mean
	flops, dramBytes                       float64
	rooflineFLOPs, rooflineBytes           float64
	haveFLOPs, haveBytes                   bool
	kernels                                map[string]*kernel
	untracked                              int // launches of kernels beyond maxKernels
	firstDevice, firstComputeCapability    string

	// untrackedByClass weighs the launches of kernels beyond maxKernels
	// by the class of each launch on its own: their names are not kept.
	untrackedByClass map[v1alpha1.BoundType]weight
}

// weight is GPU time and launches, of which the class shares count one:
// launches only when no launch has a duration.
type weight struct{ time, launches float64 }

func (w weight) of(byTime bool) float64 {
	if byTime {
		return w.time
	}
	return w.launches
}

func newSummary() *summary {
	return &summary{kernels: map[string]*kernel{}, untrackedByClass: map[v1alpha1.BoundType]weight{}}
}

// add takes one launch; it keeps nothing of l but copies of what it needs.
func (s *summary) add(l *ncu.Launch) error {
	if s.launches == 0 {
		s.firstDevice, s.firstComputeCapability = strings.Clone(Truncate(l.Device, v1alpha1.MaxProductNameLength)), strings.Clone(Truncate(l.ComputeCapability, 16))
	}
	s.launches++
	ns := l.Metrics[ncu.MetricDuration]
	s.total += ns
	for _, m := range []struct {
		acc    *mean
		metric string
	}{
		{&s.sm, ncu.MetricSMThroughput},
		{&s.memory, ncu.MetricMemoryThroughput},
		{&s.dram, ncu.MetricDRAMThroughput},
		{&s.l2, ncu.MetricL2Throughput},
		{&s.occupancy, ncu.MetricAchievedOccupancy},
		{&s.waves, ncu.MetricWavesPerSM},
	} {
		if v, ok := l.Metric(m.metric); ok {
			m.acc.add(v, ns)
		}
	}
	f, okF := l.FLOPs()
	b, okB := l.DRAMBytes()
	if okF {
		s.flops, s.haveFLOPs = s.flops+f, true
	}
	if okB {
		s.dramBytes, s.haveBytes = s.dramBytes+b, true
	}
	// The intensity only counts launches where both were measured, or a
	// launch without FLOP counts would look memory-bound.
	if okF && okB {
		s.rooflineFLOPs += f
		s.rooflineBytes += b
	}

	name := Truncate(l.Kernel, maxKernelName)
	k := s.kernels[name]
	if k == nil {
		if len(s.kernels) >= maxKernels {
			s.untracked++
			c := Classify(toMilliPercent(l.Metrics[ncu.MetricSMThroughput]), toMilliPercent(l.Metrics[ncu.MetricMemoryThroughput]))
			w := s.untrackedByClass[c]
			s.untrackedByClass[c] = weight{w.time + ns, w.launches + 1}
			return nil
		}
		// A copy: the launch's strings share the parser's record.
		k = &kernel{name: strings.Clone(name)}
		s.kernels[k.name] = k
	}
	if k.launches < math.MaxInt32 {
		k.launches++
	}
	k.gpuTime += ns
	k.sm.add(l.Metrics[ncu.MetricSMThroughput], ns)
	k.memory.add(l.Metrics[ncu.MetricMemoryThroughput], ns)
	return nil
}

// status turns the summary into a WorkloadProfile status.
func (s *summary) status(ctx context.Context, rep *ncu.Report, opts Options) v1alpha1.WorkloadProfileStatus {
	logger := klog.FromContext(ctx)
	observedAt := opts.ObservedAt
	if observedAt.IsZero() {
		observedAt = time.Now()
	}
	st := v1alpha1.WorkloadProfileStatus{
		BoundType:  v1alpha1.BoundTypeUnknown,
		NCUVersion: ncuVersion(logger, rep.Version, opts.NCUVersion),
		ObservedAt: &metav1.Time{Time: observedAt},
		Source:     opts.Source,
		Report:     opts.Report,
		PeakMemory: opts.PeakMemory,
	}
	st.Device = s.device(logger, opts.Device)
	now := metav1.NewTime(observedAt)

	if s.launches == 0 {
		st.Conditions = []metav1.Condition{{
			Type: v1alpha1.ConditionProfiled, Status: metav1.ConditionFalse, Reason: v1alpha1.ReasonNoKernels,
			Message: "the ncu report holds no kernel launches", LastTransitionTime: now,
		}}
		return st
	}

	// All-zero durations would weigh nothing; count launches equally then.
	byTime := s.total > 0
	milli := func(m mean) *int32 {
		v, ok := m.value(byTime)
		if !ok {
			return nil
		}
		p := toMilliPercent(v)
		return &p
	}
	st.SMThroughputMilliPercent = milli(s.sm)
	st.MemoryThroughputMilliPercent = milli(s.memory)
	st.DRAMThroughputMilliPercent = milli(s.dram)
	st.L2ThroughputMilliPercent = milli(s.l2)
	st.AchievedOccupancyMilliPercent = milli(s.occupancy)
	st.SMThroughput = formatPercent(st.SMThroughputMilliPercent)
	st.MemoryThroughput = formatPercent(st.MemoryThroughputMilliPercent)
	st.AchievedOccupancy = formatPercent(st.AchievedOccupancyMilliPercent)
	waves, haveWaves := s.waves.value(byTime)
	if haveWaves {
		st.WavesPerSM = resource.NewMilliQuantity(clampInt64(waves*1000), resource.DecimalSI)
	}
	if s.haveBytes {
		st.DRAMBytes = resource.NewQuantity(clampInt64(s.dramBytes), resource.DecimalSI)
	}
	if s.haveFLOPs {
		st.FLOPs = resource.NewQuantity(clampInt64(s.flops), resource.DecimalSI)
	}
	if s.rooflineFLOPs > 0 && s.rooflineBytes > 0 {
		st.ArithmeticIntensity = resource.NewMilliQuantity(clampInt64(s.rooflineFLOPs/s.rooflineBytes*1000), resource.DecimalSI)
	}
	st.KernelLaunches = int32(min(s.launches, math.MaxInt32))
	st.TotalGPUTimeNanoseconds = clampInt64(s.total)
	st.TopKernels = topKernels(s.kernels, s.total, s.launches, opts.TopKernels)
	smMilli, memMilli := ptrOrZero(st.SMThroughputMilliPercent), ptrOrZero(st.MemoryThroughputMilliPercent)
	// The class is decided on the stored shares, not on the averaged
	// throughputs above, so that ClassifyShares of the status gives it.
	shares := s.boundTimeShares(byTime)
	st.BoundTimeShares = &shares
	st.BoundType = ClassifyShares(shares)

	kernels := count(len(s.kernels), "kernel", "kernels")
	if s.untracked > 0 {
		kernels = fmt.Sprintf("more than %d kernels", maxKernels)
	}
	msg := fmt.Sprintf("%s of %s, %s of GPU time: SM %s, memory %s",
		count(int(st.KernelLaunches), "launch", "launches"), kernels,
		time.Duration(st.TotalGPUTimeNanoseconds), FormatMilliPercent(smMilli), FormatMilliPercent(memMilli))
	if d := describeShares(shares); d != "" {
		msg += "; GPU time by class: " + d
	}
	if haveWaves && waves < 1 {
		msg += fmt.Sprintf("; %.2f waves per SM, so the grids do not fill the GPU", waves)
	}
	if rep.Dropped > 0 {
		msg += fmt.Sprintf("; %s without a duration or throughput left out", count(rep.Dropped, "launch", "launches"))
	}
	if s.untracked > 0 {
		msg += fmt.Sprintf("; %s of kernels beyond the first %d are counted but not ranked", count(s.untracked, "launch", "launches"), maxKernels)
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
	rc, judged := roofline(st.BoundType, s.rooflineFLOPs, s.rooflineBytes, peakFLOPS, peakBandwidth)
	if judged {
		rc.LastTransitionTime = now
		st.Conditions = append(st.Conditions, rc)
	}
	logger.V(2).Info("Summarised ncu report", "boundType", st.BoundType, "launches", st.KernelLaunches,
		"kernels", len(s.kernels), "roofline", rc.Reason, "rooflineMessage", rc.Message)
	return st
}

// boundTimeShares classifies each kernel by its own duration-weighted
// throughputs, rounded as topKernels stores them, and gives each class's
// share of the GPU time: of the launches, when no launch has a duration.
func (s *summary) boundTimeShares(byTime bool) v1alpha1.BoundTimeShares {
	byClass := map[v1alpha1.BoundType]float64{}
	for c, w := range s.untrackedByClass {
		byClass[c] += w.of(byTime)
	}
	// In name order: a float sum does not depend on the map's order then.
	for _, name := range slices.Sorted(maps.Keys(s.kernels)) {
		k := s.kernels[name]
		sm, _ := k.sm.value(byTime)
		memory, _ := k.memory.value(byTime)
		c := Classify(toMilliPercent(sm), toMilliPercent(memory))
		byClass[c] += weight{k.gpuTime, k.sm.count}.of(byTime)
	}
	total := s.total
	if !byTime {
		total = float64(s.launches)
	}
	return sharesOf(byClass, total)
}

// ncuVersion is the version to record: the report's, or else the
// caller's. One the API would refuse is left out with the reason logged,
// never the status with it: the API server refuses a whole status for one
// field, and the profile matters more than the version. A version cut
// short would be a different version, so it is not cut.
func ncuVersion(logger klog.Logger, reported, fallback string) string {
	for _, v := range []struct{ version, from string }{{reported, "the report"}, {fallback, "the caller"}} {
		switch {
		case v.version == "":
		case len(v.version) > v1alpha1.MaxNCUVersionLength:
			logger.Info("Leaving out an ncu version longer than the API allows", "from", v.from,
				"version", Truncate(v.version, v1alpha1.MaxNCUVersionLength), "bytes", len(v.version), "maximum", v1alpha1.MaxNCUVersionLength)
		default:
			return v.version
		}
	}
	return ""
}

// device merges what the report says about the device with what the caller
// knows better, held to the API's limits: a product name is cut to its
// length, and a compute capability that is not "major.minor" is left out,
// with the reason logged.
func (s *summary) device(logger klog.Logger, override v1alpha1.ProfiledDevice) *v1alpha1.ProfiledDevice {
	d := override
	if s.launches > 0 {
		if d.ComputeCapability == "" {
			d.ComputeCapability = s.firstComputeCapability
		}
		// ncu's Device column is an index; only a name is worth keeping.
		if _, err := strconv.Atoi(s.firstDevice); d.ProductName == "" && err != nil {
			d.ProductName = s.firstDevice
		}
	}
	d.ProductName = Truncate(d.ProductName, v1alpha1.MaxProductNameLength)
	if cc := d.ComputeCapability; cc != "" && !computeCapability.MatchString(cc) {
		logger.Info("Leaving out a compute capability that is not major.minor", "computeCapability", Truncate(cc, 16))
		d.ComputeCapability = ""
	}
	if d == (v1alpha1.ProfiledDevice{}) {
		return nil
	}
	return &d
}

func topKernels(kernels map[string]*kernel, total float64, launches, n int) []v1alpha1.KernelSummary {
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
	byTime := total > 0
	out := make([]v1alpha1.KernelSummary, 0, n)
	for _, k := range sorted[:n] {
		share := float64(k.launches) / float64(launches)
		if byTime {
			share = k.gpuTime / total
		}
		sm, _ := k.sm.value(byTime)
		memory, _ := k.memory.value(byTime)
		out = append(out, v1alpha1.KernelSummary{
			Name:                         k.name,
			Launches:                     k.launches,
			TimeShareMilliPercent:        toMilliPercent(share * 100),
			SMThroughputMilliPercent:     toMilliPercent(sm),
			MemoryThroughputMilliPercent: toMilliPercent(memory),
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

// toMilliPercent rounds a percentage to milli-percent, clamped to the API's
// range: ncu can print a hair over 100 % for a saturated unit. NaN, which
// no figure Scan passes on can produce, is 0 rather than MinInt32.
func toMilliPercent(p float64) int32 {
	if math.IsNaN(p) {
		return 0
	}
	return int32(math.Round(math.Max(0, math.Min(100, p)) * 1000))
}

// clampInt64 rounds to the API's int64 range, from 0; NaN is 0.
func clampInt64(v float64) int64 {
	switch {
	case math.IsNaN(v) || v <= 0:
		return 0
	case v >= math.MaxInt64:
		return math.MaxInt64
	}
	return int64(math.Round(v))
}

// Truncate shortens s to at most n bytes without splitting a UTF-8
// sequence, for the API's limits on status strings.
func Truncate(s string, n int) string {
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
