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

package rewrite

import (
	"fmt"
	"strings"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// MinMeasuredRuns is how many runs on whole GPUs of a model a workload needs
// before its busy time there ranks the model: a single run can be an
// outlier.
const MinMeasuredRuns = 2

// minMeasuredModels is how many models the workload must have run on
// before its runs rank one above another.
const minMeasuredModels = 2

// RanksModels says whether u's runs can rank GPU models: MinMeasuredRuns
// runs or more on each of minMeasuredModels models. Where it is false, the
// ladder is the published figures' alone.
func RanksModels(u *prismv1alpha1.UsageProfile) bool {
	return len(busyByModel(u)) >= minMeasuredModels
}

// busyByModel is u's busy time per run, in milliseconds, on each model it
// ran on at least MinMeasuredRuns times.
func busyByModel(u *prismv1alpha1.UsageProfile) map[string]int64 {
	if u == nil {
		return nil
	}
	out := map[string]int64{}
	for _, m := range u.Models {
		if m.Runs >= MinMeasuredRuns && m.BusyMilliseconds > 0 {
			out[m.ProductName] = m.BusyMilliseconds
		}
	}
	return out
}

// measuredFirst puts ahead of a ladder that starts with the top class of
// the figure bounding the workload a tier of the models in it that the
// workload's own runs were measured faster on. Published figures put
// models within minGapRatio of each other in one class, where a workload
// can still run far faster on one (the Gavel throughputs measure
// memory-bound jobs 1.4-2.4x faster on a V100 than on a P100, whose
// bandwidths are 1.23x apart); only the workload's runs can tell.
//
// A fleet of one class has no ladder to put the tier ahead of: it gets the
// tier and fits.
func measuredFirst(ladder []tier, fleet *Fleet, bound prismv1alpha1.BoundType, busy map[string]int64) []tier {
	f := figureOf(bound)
	if len(busy) < minMeasuredModels || len(ladder) > 0 && ladder[0].name != tierName(f, "top") && ladder[0].name != fits.name {
		return ladder
	}
	t, ok := measuredTier(cutFleet(fleet.Models, f), busy)
	if !ok {
		return ladder
	}
	if len(ladder) == 0 {
		return []tier{t, fits}
	}
	return append([]tier{t}, ladder...)
}

// measuredTier splits c's top class where the workload's busy time per run
// on every measured model above the split is at least minGapRatio below
// that on every measured model beneath it, and the figure has a threshold
// between the two: the largest such step. Only a split the figure agrees
// with can be expressed, so a model measured faster than one with a higher
// figure is left in the class.
func measuredTier(c fleetCut, busy map[string]int64) (tier, bool) {
	if len(c.classes) == 0 {
		return tier{}, false
	}
	top := c.classes[0].models
	at, grid, ratio := -1, -1, 0.0
	var above, below modelBusy
	for k := 0; k+1 < len(top); k++ {
		_, slowAbove, okAbove := extremes(top[:k+1], busy)
		fastBelow, _, okBelow := extremes(top[k+1:], busy)
		if !okAbove || !okBelow {
			continue
		}
		r := float64(fastBelow.busy) / float64(slowAbove.busy)
		if r < minGapRatio || r <= ratio {
			continue
		}
		if g := snap(c.fig, c.fig.of(top[k+1]), c.fig.of(top[k])); g >= 0 {
			at, grid, ratio, above, below = k, g, r, slowAbove, fastBelow
		}
	}
	if at < 0 {
		return tier{}, false
	}
	threshold := thresholdGrids[c.fig][grid]
	names := modelNames(top[:at+1])
	return tier{
		name:      tierName(c.fig, "measured"),
		selectors: []selectorID{thresholdSelector(c.fig, grid, false)},
		reason: fmt.Sprintf("%s >= %d %s: %s; the workload's runs took %.1fx less GPU time on %s than on %s",
			c.fig.attribute(), threshold, c.fig.unit(), strings.Join(names, ", "), ratio, above.model, below.model),
		models: names,
		bound:  &lowerBound{c.fig, threshold},
	}, true
}

// modelBusy is a model's busy time per run, in milliseconds.
type modelBusy struct {
	model string
	busy  int64
}

// extremes are the measured models among models with the shortest and the
// longest busy time; ok is false where none was measured.
func extremes(models []Model, busy map[string]int64) (fastest, slowest modelBusy, ok bool) {
	for _, m := range models {
		b, measured := busy[m.Name]
		if !measured {
			continue
		}
		r := modelBusy{m.Name, b}
		if !ok || b < fastest.busy {
			fastest = r
		}
		if !ok || b > slowest.busy {
			slowest = r
		}
		ok = true
	}
	return fastest, slowest, ok
}
