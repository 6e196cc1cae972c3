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

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// MinSamples is the fewest duty-cycle samples a run needs to be merged.
const MinSamples = 3

// PinnedMargin is how close, in percentage points, the duty cycle's 95th
// percentile may come to a compute share before the run counts as pinned
// at its limit.
const PinnedMargin = 5

// MaxPeakMemoryBytes, 16 TiB, is the largest previous peak memory that
// Merge reads from a profile. Whoever may write a WorkloadProfile's status
// can set its peak, and a peak above what any GPU holds is not a reading:
// averaged in, it would size the workload's next share above every GPU (a
// peak of 1Ei became one of 512Pi), and one near the int64 limit
// overflowed the mean. The largest GPU in pkg/gpu's spec table holds 180 GB; the bound
// leaves a margin of some ninety times that for GPUs to come.
const MaxPeakMemoryBytes = 16 << 40

// Finished is a run that ended, with what it ran on.
type Finished struct {
	Run         Run
	ProductName string
	// Share is the part of a GPU the run was given, nil for a run on whole
	// GPUs.
	Share *gpuv1alpha1.Share
	// Profiled is a run under Nsight Compute.
	Profiled bool
	EndedAt  time.Time
}

// Merge folds a finished run into the profile's usage, prev (nil for none),
// and returns the new usage; prev is not changed. It returns nil when the
// run has fewer than MinSamples samples. A previous peak memory that is not
// a byte count up to MaxPeakMemoryBytes is logged and left out, and the
// run's own peak is the profile's.
func Merge(ctx context.Context, prev *prismv1alpha1.UsageProfile, f Finished) *prismv1alpha1.UsageProfile {
	samples := f.Run.Samples()
	if samples < MinSamples {
		return nil
	}
	out := &prismv1alpha1.UsageProfile{}
	if prev != nil && prev.Runs > 0 {
		out = prev.DeepCopy()
	} else {
		// A profile without runs has no figures worth averaging with.
		prev = nil
	}
	p50, _ := f.Run.DutyCyclePercentile(50)
	p95, _ := f.Run.DutyCyclePercentile(95)
	out.DutyCycleP50MilliPercent = halfway(out.DutyCycleP50MilliPercent, ptr.To(int32(p50*1000)))
	out.DutyCycleP95MilliPercent = halfway(out.DutyCycleP95MilliPercent, ptr.To(int32(p95*1000)))
	out.SMActivityMilliPercent = halfway(out.SMActivityMilliPercent, milli(f.Run.SMActivityMean()))
	out.DRAMActivityMilliPercent = halfway(out.DRAMActivityMilliPercent, milli(f.Run.DRAMActivityMean()))
	if f.Run.MemorySamples > 0 {
		peak := f.Run.PeakMemoryBytes
		if prev != nil && prev.PeakMemory != nil {
			// A copy: String caches its result in the Quantity, and prev
			// is not changed.
			q := *prev.PeakMemory
			if old, err := previousPeak(q); err != nil {
				klog.FromContext(ctx).Info("Leaving the profile's previous peak memory out of the merge", "previous", q.String(), "reason", err.Error())
			} else {
				peak = max(peak, halfwayCount(old, peak))
			}
		}
		out.PeakMemory = resource.NewQuantity(peak, resource.BinarySI)
	}
	out.Samples = samples
	// Runs counts up to its type's end: a count that had reached it
	// would otherwise turn negative, and the API server refuse it.
	if out.Runs < math.MaxInt32 {
		out.Runs++
	}
	out.ProductName = f.ProductName
	out.Share = nil
	if f.Share != nil {
		out.Share = prismv1alpha1.NewGrantedShare(*f.Share)
	}
	out.Exceeded = Exceeded(f.Run, f.Share)
	out.Models = mergeModel(out.Models, f)
	out.ObservedAt = ptr.To(metav1.NewTime(f.EndedAt.UTC().Truncate(time.Second)))
	return out
}

// MaxModels is how many GPU models a profile keeps busy times for, the
// bound the CRD sets; a run on one more replaces the model with the fewest
// runs.
const MaxModels = 16

// maxBusySeconds bounds a run's busy time at a year of a thousand GPUs, so
// that a run read back from a damaged record cannot overflow the mean.
const maxBusySeconds = 1000 * 365 * 24 * 3600

// mergeModel folds a run on whole GPUs into its model's busy time, and
// returns models, which it may change. A run on a share is left out: what
// it took says more about its neighbours than about the model. So is a
// profiled run: Nsight Compute replays each kernel it measures.
func mergeModel(models []prismv1alpha1.ModelUsage, f Finished) []prismv1alpha1.ModelUsage {
	if f.Share != nil || f.Profiled || f.ProductName == "" || !(f.Run.BusySeconds > 0) {
		return models
	}
	busy := int64(math.Round(min(f.Run.BusySeconds, maxBusySeconds) * 1000))
	i := slices.IndexFunc(models, func(m prismv1alpha1.ModelUsage) bool { return m.ProductName == f.ProductName })
	if i < 0 {
		if len(models) >= MaxModels {
			fewest := 0
			for j, m := range models {
				if m.Runs < models[fewest].Runs {
					fewest = j
				}
			}
			models = slices.Delete(models, fewest, fewest+1)
		}
		return append(models, prismv1alpha1.ModelUsage{ProductName: f.ProductName, Runs: 1, BusyMilliseconds: busy})
	}
	m := &models[i]
	m.BusyMilliseconds = halfwayCount(min(max(m.BusyMilliseconds, 0), maxBusySeconds*1000), busy)
	if m.Runs < math.MaxInt32 {
		m.Runs++
	}
	return models
}

// halfway is the exponentially weighted mean with the newest value at one
// half, rounded to the nearest; a side that is unknown leaves the other.
func halfway(old, newest *int32) *int32 {
	switch {
	case newest == nil:
		return old
	case old == nil:
		return ptr.To(*newest)
	}
	return ptr.To((*old + *newest + 1) / 2)
}

// previousPeak is a profile's peak memory in bytes, or why it is not one
// that a GPU could have held.
func previousPeak(q resource.Quantity) (int64, error) {
	if q.Sign() < 0 {
		return 0, errors.New("negative")
	}
	if q.Cmp(*resource.NewQuantity(MaxPeakMemoryBytes, resource.BinarySI)) > 0 {
		return 0, fmt.Errorf("above %s, more than any GPU holds", resource.NewQuantity(MaxPeakMemoryBytes, resource.BinarySI))
	}
	v, ok := q.AsInt64()
	if !ok {
		return 0, errors.New("not a whole number of bytes")
	}
	return v, nil
}

// halfwayCount is halfway rounded to the nearest for counts that are not
// negative (bytes, milliseconds), without the overflow of adding them first.
func halfwayCount(old, newest int64) int64 {
	return old/2 + newest/2 + (old%2+newest%2+1)/2
}

func milli(percent float64, ok bool) *int32 {
	if !ok {
		return nil
	}
	return ptr.To(int32(percent*1000 + 0.5))
}

// Exceeded says what a run on a share used more of than it was held to
// (s: its memory, and a compute cap where its claim asked for one): its
// peak memory above the memory share, or, under a cap below the whole GPU,
// a duty cycle whose 95th percentile came within PinnedMargin points of
// the cap (the workload ran at its cap, or past it where nothing enforces
// the cap). Nil when it kept within them, and for runs on whole GPUs.
func Exceeded(r Run, s *gpuv1alpha1.Share) *prismv1alpha1.ShareExceeded {
	if s == nil {
		return nil
	}
	var resources []prismv1alpha1.ShareResource
	var why []string
	if s.LimitsMemory() && r.MemorySamples > 0 && r.PeakMemoryBytes > s.MemoryBytes {
		resources = append(resources, prismv1alpha1.ShareResourceMemory)
		why = append(why, fmt.Sprintf("peak memory %s above its share of %s",
			resource.NewQuantity(r.PeakMemoryBytes, resource.BinarySI), resource.NewQuantity(s.MemoryBytes, resource.BinarySI)))
	}
	if p95, ok := r.DutyCyclePercentile(95); ok && s.LimitsCompute() && int32(p95) >= s.ComputePercent-PinnedMargin {
		resources = append(resources, prismv1alpha1.ShareResourceCompute)
		why = append(why, fmt.Sprintf("duty cycle p95 %d%% at its compute cap of %d%%", p95, s.ComputePercent))
	}
	if len(resources) == 0 {
		return nil
	}
	return &prismv1alpha1.ShareExceeded{Resources: resources, Message: strings.Join(why, "; ")}
}
