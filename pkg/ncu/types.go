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

package ncu

import (
	"math"
	"time"
)

// Metric names, as ncu spells them on the raw page and with
// --print-metric-name name on the details page.
const (
	MetricSMThroughput         = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
	MetricMemoryThroughput     = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
	MetricDRAMThroughput       = "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed"
	MetricL2Throughput         = "lts__throughput.avg.pct_of_peak_sustained_elapsed"
	MetricL1Throughput         = "l1tex__throughput.avg.pct_of_peak_sustained_active"
	MetricDuration             = "gpu__time_duration.sum"
	MetricWavesPerSM           = "launch__waves_per_multiprocessor"
	MetricAchievedOccupancy    = "sm__warps_active.avg.pct_of_peak_sustained_active"
	MetricTheoreticalOccupancy = "sm__maximum_warps_per_active_cycle_pct"
	MetricDRAMBytes            = "dram__bytes.sum"
	MetricDRAMBytesPerSecond   = "dram__bytes.sum.per_second"
	MetricSMCyclesPerSecond    = "smsp__cycles_elapsed.avg.per_second"

	// FP32 instruction counts: each thread-level instruction is one
	// operation, and an FMA is two FLOPs.
	MetricFAdd = "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
	MetricFMul = "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum"
	MetricFFMA = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum"

	// The forms the roofline section collects: per elapsed cycle, to be
	// multiplied by cycles per second and the duration.
	MetricFAddPerCycle = MetricFAdd + ".per_cycle_elapsed"
	MetricFMulPerCycle = MetricFMul + ".per_cycle_elapsed"
	MetricFFMAPerCycle = MetricFFMA + ".per_cycle_elapsed"

	// metricDisplayName is a string metric that carries the device's
	// product name on the raw page.
	metricDisplayName = "device__attribute_display_name"
)

// renamed maps metric names older ncu versions used to their current name,
// so that callers only ever see the current one.
var renamed = map[string]string{
	"dram__throughput.avg.pct_of_peak_sustained_elapsed": MetricDRAMThroughput,
}

// known are the metrics Scan keeps: those the summary reads. Every other
// metric of a report is skipped, so that a launch holds a bounded map
// whatever the report names.
var known = map[string]bool{
	MetricSMThroughput: true, MetricMemoryThroughput: true, MetricDRAMThroughput: true,
	MetricL2Throughput: true, MetricL1Throughput: true, MetricDuration: true,
	MetricWavesPerSM: true, MetricAchievedOccupancy: true, MetricTheoreticalOccupancy: true,
	MetricDRAMBytes: true, MetricDRAMBytesPerSecond: true, MetricSMCyclesPerSecond: true,
	MetricFAdd: true, MetricFMul: true, MetricFFMA: true,
	MetricFAddPerCycle: true, MetricFMulPerCycle: true, MetricFFMAPerCycle: true,
}

// required lists the metrics without which a launch cannot be classified
// or weighted, with the label the details page prints for each, so that
// an error can name both.
var required = []struct{ name, label string }{
	{MetricSMThroughput, "Compute (SM) Throughput"},
	{MetricMemoryThroughput, "Memory Throughput"},
	{MetricDuration, "Duration"},
}

// Layout is the CSV layout of a report.
type Layout string

const (
	// LayoutRaw is the wide layout of --page raw.
	LayoutRaw Layout = "raw"
	// LayoutDetails is the long layout of the default details page.
	LayoutDetails Layout = "details"
)

// Report is what Scan learnt of a report besides its launches.
type Report struct {
	// Version of ncu, when the input carried it (for example from
	// `ncu --version` output captured along with the report).
	Version string
	// Layout the input was in.
	Layout Layout
	// Launches counts the launches passed on, those with every required
	// metric measured.
	Launches int
	// Dropped counts launches left out because a required metric was
	// "n/a" for them.
	Dropped int
	// measured has bit i set when required[i] was measured for some launch.
	measured uint8
}

// Launch is one profiled kernel launch.
type Launch struct {
	// ID is ncu's launch ID.
	ID string
	// Kernel is the kernel's name as ncu printed it.
	Kernel string
	// Device is the product name when the report carries it, otherwise
	// the device index ncu printed.
	Device string
	// ComputeCapability as "major.minor", when the report carries it.
	ComputeCapability string
	// Metrics holds the metrics this package knows (the Metric*
	// constants) that were measured for the launch, in base units:
	// percent, nanoseconds for times, bytes, and per second for rates.
	// Metrics ncu printed as "n/a" are absent.
	Metrics map[string]float64
}

// Metric returns a metric's value and whether it was measured.
func (l *Launch) Metric(name string) (float64, bool) {
	v, ok := l.Metrics[name]
	return v, ok
}

// Duration is the launch's GPU time.
func (l *Launch) Duration() time.Duration {
	return time.Duration(math.Round(l.Metrics[MetricDuration]))
}

// DRAMBytes returns the DRAM traffic of the launch, from the byte count or
// from the rate and the duration.
func (l *Launch) DRAMBytes() (float64, bool) {
	if v, ok := l.Metrics[MetricDRAMBytes]; ok {
		return v, true
	}
	if rate, ok := l.Metrics[MetricDRAMBytesPerSecond]; ok {
		return rate * l.Metrics[MetricDuration] / 1e9, true
	}
	return 0, false
}

// FLOPs returns the FP32 floating point operations of the launch. It needs
// all three instruction classes, as counts or as per-cycle rates together
// with the SM clock; a partial set would understate the work.
func (l *Launch) FLOPs() (float64, bool) {
	if add, mul, fma, ok := l.three(MetricFAdd, MetricFMul, MetricFFMA); ok {
		return add + mul + 2*fma, true
	}
	add, mul, fma, ok := l.three(MetricFAddPerCycle, MetricFMulPerCycle, MetricFFMAPerCycle)
	if !ok {
		return 0, false
	}
	hz, ok := l.Metrics[MetricSMCyclesPerSecond]
	if !ok {
		return 0, false
	}
	cycles := hz * l.Metrics[MetricDuration] / 1e9
	return (add + mul + 2*fma) * cycles, true
}

func (l *Launch) three(a, b, c string) (float64, float64, float64, bool) {
	x, ok1 := l.Metrics[a]
	y, ok2 := l.Metrics[b]
	z, ok3 := l.Metrics[c]
	return x, y, z, ok1 && ok2 && ok3
}
