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

package usage

import "math"

// Unknown marks a figure NVML did not give for a sample.
const Unknown = -1

// Sample is what one GPU showed the claim's workload using at one moment.
type Sample struct {
	// DutyCyclePercent is the share of the last sample period in which a
	// kernel of the workload ran, 0 to 100, or Unknown.
	DutyCyclePercent int
	// MemoryBytes is the device memory the workload held, or Unknown.
	MemoryBytes int64
	// SMActivityPercent and DRAMActivityPercent are GPM's SM activity and
	// DRAM bandwidth use, 0 to 100, or Unknown where the GPU has no GPM or
	// others share it.
	SMActivityPercent   float64
	DRAMActivityPercent float64
	// Seconds is how long the sample stands for: the time since the one
	// before it. Zero adds no busy time.
	Seconds float64
}

// Run is the running aggregate of one claim's samples. It is small and of
// fixed size, so that the plugin can persist it often.
type Run struct {
	// DutyCycle counts the samples of each whole per cent of duty cycle.
	DutyCycle [101]int32 `json:"dutyCycle"`
	// MemorySamples counts the samples that gave memory; PeakMemoryBytes
	// is the largest.
	MemorySamples   int32 `json:"memorySamples,omitempty"`
	PeakMemoryBytes int64 `json:"peakMemoryBytes,omitempty"`
	// The GPM figures' sums and counts, for their means.
	SMActivitySum       float64 `json:"smActivitySum,omitempty"`
	SMActivitySamples   int32   `json:"smActivitySamples,omitempty"`
	DRAMActivitySum     float64 `json:"dramActivitySum,omitempty"`
	DRAMActivitySamples int32   `json:"dramActivitySamples,omitempty"`
	// BusySeconds is how long a kernel of the workload ran, by the duty
	// cycle of each sample over the time it stands for, summed over GPUs.
	BusySeconds float64 `json:"busySeconds,omitempty"`
}

// Add folds one sample into the run. Figures out of range are clamped:
// NVML has reported over 100 % for a moment on some drivers.
func (r *Run) Add(s Sample) {
	if s.DutyCyclePercent != Unknown {
		duty := min(max(s.DutyCyclePercent, 0), 100)
		r.DutyCycle[duty]++
		if s.Seconds > 0 {
			r.BusySeconds += float64(duty) / 100 * s.Seconds
		}
	}
	if s.MemoryBytes != Unknown {
		r.MemorySamples++
		r.PeakMemoryBytes = max(r.PeakMemoryBytes, s.MemoryBytes)
	}
	if s.SMActivityPercent != Unknown {
		r.SMActivitySum += min(max(s.SMActivityPercent, 0), 100)
		r.SMActivitySamples++
	}
	if s.DRAMActivityPercent != Unknown {
		r.DRAMActivitySum += min(max(s.DRAMActivityPercent, 0), 100)
		r.DRAMActivitySamples++
	}
}

// Samples is how many samples gave a duty cycle. A run is read back from
// the plugin's state directory; counts that could not have been added up
// (negative, or past int32 together) are taken at their bound.
func (r *Run) Samples() int32 {
	var n int64
	for _, c := range r.DutyCycle {
		n += int64(max(c, 0))
	}
	return int32(min(n, math.MaxInt32))
}

// DutyCyclePercentile is the nearest-rank p-th percentile (0 < p <= 100)
// of the duty cycle in whole per cents: the smallest value that at least p
// per cent of the samples do not exceed. ok is false without samples.
func (r *Run) DutyCyclePercentile(p float64) (percent int, ok bool) {
	n := r.Samples()
	if n == 0 {
		return 0, false
	}
	// The rank, 1-based, rounded up; at least the first sample. The product
	// comes first so that 95 % of 20 samples is exactly 19.
	rank := max(int32(math.Ceil(p*float64(n)/100)), 1)
	var seen int32
	for v, c := range r.DutyCycle {
		seen += c
		if seen >= rank {
			return v, true
		}
	}
	return 100, true
}

// SMActivityMean and DRAMActivityMean are the GPM means in per cent; ok is
// false where no sample had them.
func (r *Run) SMActivityMean() (float64, bool) {
	return mean(r.SMActivitySum, r.SMActivitySamples)
}

func (r *Run) DRAMActivityMean() (float64, bool) {
	return mean(r.DRAMActivitySum, r.DRAMActivitySamples)
}

// mean is sum/n within 0 to 100 per cent, the range Add keeps every
// sample in; a run read back with sums out of it has no mean.
func mean(sum float64, n int32) (float64, bool) {
	if n <= 0 {
		return 0, false
	}
	m := sum / float64(n)
	if !(m >= 0 && m <= 100) {
		return 0, false
	}
	return m, true
}
