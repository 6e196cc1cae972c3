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
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// figure is a number the plugin publishes per device that a ladder ranks
// the fleet by.
type figure int

const (
	figBandwidth figure = iota
	figFP32
	numFigures
)

func (f figure) attribute() gpuv1alpha1.AttributeName {
	return [...]gpuv1alpha1.AttributeName{gpuv1alpha1.MemoryBandwidthGBpsAttribute, gpuv1alpha1.FP32GFLOPSAttribute}[f]
}

// capacity is the device capacity the plugin publishes the figure as, where
// asked (see TierBoundsAsCapacity).
func (f figure) capacity() resourceapi.QualifiedName {
	return [...]gpuv1alpha1.CapacityName{gpuv1alpha1.MemoryBandwidthGBpsCapacity, gpuv1alpha1.FP32GFLOPSCapacity}[f].Qualified()
}

func (f figure) unit() string { return [...]string{"GB/s", "GFLOPS"}[f] }

func (f figure) of(m Model) int64 {
	if f == figBandwidth {
		return m.BandwidthGBps
	}
	return m.FP32GFLOPS
}

// thresholdGrids are the only thresholds a fleet-relative tier may use: the
// Renard R10 preferred numbers (steps of 25 %) over the range GPUs span.
// Snapping keeps the catalogue fixed and small whatever the fleet, and a
// step finer than minGapRatio guarantees that every gap worth cutting holds
// a grid point.
var thresholdGrids = [numFigures][]int64{
	figBandwidth: {200, 250, 315, 400, 500, 630, 800, 1000, 1250, 1600, 2000, 2500, 3150, 4000, 5000, 6300, 8000},
	figFP32:      {5000, 6300, 8000, 10000, 12500, 16000, 20000, 25000, 31500, 40000, 50000, 63000, 80000, 100000},
}

const (
	// minGapRatio is the smallest step between two models' figures that
	// separates them into classes. Below 30 % the difference is within what
	// clocks, power limits and the kernel's own variance move.
	minGapRatio = 1.3
	// maxClasses bounds the cut: every class below the top can cost a
	// failing tier scan on the nodes that lack it.
	maxClasses = 3
	// middleGapRatio is what falling from the second class to the third
	// must cost before performance gets a middle tier: each extra tier is
	// a scan of every device on the nodes that fail it.
	middleGapRatio = 2.0
	// adequateShare is how much of the fleet's best figure a cheaper class
	// must reach for economy to prefer it: within 2.5x of the best.
	adequateShareNum, adequateShareDen = 2, 5
)

// thresholdSelector is the catalogue entry "figure >= grid[i]" or, with
// below, "figure < grid[i]".
func thresholdSelector(f figure, i int, below bool) selectorID {
	id := selThresholdFirst
	for g := range f {
		id += selectorID(2 * len(thresholdGrids[g]))
	}
	id += selectorID(2 * i)
	if below {
		id++
	}
	return id
}

var selThresholdFirst = selCCFirst + selectorID(len(ccFloors))

func thresholdExpressions() []string {
	var out []string
	for f := range numFigures {
		for _, g := range thresholdGrids[f] {
			for _, op := range []string{">=", "<"} {
				out = append(out, fmt.Sprintf(`%[1]q in %[2]s && %[2]s.%[1]s %[3]s %[4]d`, f.attribute(), attrs, op, g))
			}
		}
	}
	return out
}

// class is a run of models whose figures lie within minGapRatio of their
// neighbours.
type class struct {
	models    []Model // best first
	low, high int64
	devices   int
}

// fleetCut is a fleet ranked and cut on one figure. cuts[i] is the grid
// index of the threshold between classes[i] and classes[i+1]: every model of
// classes[i] reaches it, none below does.
type fleetCut struct {
	fig     figure
	classes []class
	cuts    []int
	models  int
	devices int
}

// cutFleet ranks the models that publish f and cuts them at the largest
// gaps, at most maxClasses-1 of them, each at least minGapRatio and holding
// a grid point.
func cutFleet(models []Model, f figure) fleetCut {
	c := fleetCut{fig: f}
	var ranked []Model
	for _, m := range models {
		if f.of(m) > 0 && m.Devices > 0 {
			ranked = append(ranked, m)
			c.models++
			c.devices += m.Devices
		}
	}
	if len(ranked) == 0 {
		return c
	}
	slices.SortStableFunc(ranked, func(a, b Model) int {
		if d := f.of(b) - f.of(a); d != 0 {
			return int(d)
		}
		return strings.Compare(a.Name, b.Name)
	})
	type gap struct {
		at    int // cut after ranked[at]
		ratio float64
		grid  int
	}
	var gaps []gap
	for i := 0; i+1 < len(ranked); i++ {
		hi, lo := f.of(ranked[i]), f.of(ranked[i+1])
		ratio := float64(hi) / float64(lo)
		if ratio < minGapRatio {
			continue
		}
		if g := snap(f, lo, hi); g >= 0 {
			gaps = append(gaps, gap{at: i, ratio: ratio, grid: g})
		}
	}
	slices.SortStableFunc(gaps, func(a, b gap) int {
		switch {
		case a.ratio > b.ratio:
			return -1
		case a.ratio < b.ratio:
			return 1
		}
		return a.at - b.at
	})
	gaps = gaps[:min(len(gaps), maxClasses-1)]
	slices.SortFunc(gaps, func(a, b gap) int { return a.at - b.at })
	start := 0
	for i := 0; i <= len(gaps); i++ {
		end := len(ranked)
		if i < len(gaps) {
			end = gaps[i].at + 1
			c.cuts = append(c.cuts, gaps[i].grid)
		}
		cl := class{models: ranked[start:end], high: f.of(ranked[start]), low: f.of(ranked[end-1])}
		for _, m := range cl.models {
			cl.devices += m.Devices
		}
		c.classes = append(c.classes, cl)
		start = end
	}
	return c
}

// snap returns the index of the largest grid point g with lo < g <= hi,
// or -1: the highest threshold that still keeps every model at hi.
func snap(f figure, lo, hi int64) int {
	grid := thresholdGrids[f]
	for i := len(grid) - 1; i >= 0; i-- {
		if grid[i] <= hi && grid[i] > lo {
			return i
		}
	}
	return -1
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }

func (c fleetCut) threshold(i int) int64 { return thresholdGrids[c.fig][c.cuts[i]] }

// atLeast is the tier test "in classes[0..i]".
func (c fleetCut) atLeast(i int) selectorID { return thresholdSelector(c.fig, c.cuts[i], false) }

// below is the tier test "in classes[i+1..]".
func (c fleetCut) below(i int) selectorID { return thresholdSelector(c.fig, c.cuts[i], true) }

// share describes classes[from..to] for a tier's reason.
func (c fleetCut) share(from, to int) string {
	models, devices := 0, 0
	var names []string
	for _, cl := range c.classes[from : to+1] {
		for _, m := range cl.models {
			models++
			devices += m.Devices
			names = append(names, m.Name)
		}
	}
	return fmt.Sprintf("%d of %d models, %d of %d devices (%s)", models, c.models, devices, c.devices, strings.Join(names, ", "))
}

// modelNames are the models of classes[from..to].
func (c fleetCut) modelNames(from, to int) []string {
	var names []string
	for _, cl := range c.classes[from : to+1] {
		for _, m := range cl.models {
			names = append(names, m.Name)
		}
	}
	return names
}

// summary is the cut as the annotation shows it, classes best first.
func (c fleetCut) summary() string {
	parts := make([]string, 0, 2*len(c.classes))
	for i, cl := range c.classes {
		if i > 0 {
			parts = append(parts, itoa(c.threshold(i-1)))
		}
		models := make([]string, len(cl.models))
		for j, m := range cl.models {
			models[j] = fmt.Sprintf("%s %d x%d", m.Name, c.fig.of(m), m.Devices)
		}
		parts = append(parts, strings.Join(models, ", "))
	}
	return string(c.fig.attribute()) + ": " + strings.Join(parts, " | ")
}

// fitting is the fleet without the models too small for the memory floor:
// a tier that only they could match would be a scan that always fails, and
// economy must not call them adequate. Models that publish no memory stay.
func fitting(fleet *Fleet, n needs) *Fleet {
	if fleet == nil {
		return &Fleet{}
	}
	if n.floor == nil {
		return fleet
	}
	floor := n.floor.Value()
	out := &Fleet{Models: make([]Model, 0, len(fleet.Models))}
	for _, m := range fleet.Models {
		if m.MemoryBytes == 0 || m.MemoryBytes >= floor {
			out.Models = append(out.Models, m)
		}
	}
	return out
}

// fleetLadder is the ladder for bound and policy on fleet, and the cut it
// came from; a nil ladder means the fleet offers no choice that matters to
// the workload, so the claim stays as written. See docs/rewrite.md.
func fleetLadder(fleet *Fleet, bound prismv1alpha1.BoundType, policy prismv1alpha1.Policy) ([]tier, string) {
	if len(fleet.Models) == 0 {
		return nil, "no GPU model published that holds the workload"
	}
	bw := cutFleet(fleet.Models, figBandwidth)
	switch bound {
	case prismv1alpha1.BoundTypeMemoryBound:
		return rankedLadder(fleet, bw, bw, policy)
	case prismv1alpha1.BoundTypeComputeBound:
		return rankedLadder(fleet, cutFleet(fleet.Models, figFP32), bw, policy)
	case prismv1alpha1.BoundTypeLatencyBound:
		if policy == prismv1alpha1.PolicyEconomy {
			return economyLatencyLadder(bw)
		}
		return rankedLadder(fleet, cutFleet(fleet.Models, figFP32), bw, policy)
	}
	return nil, ""
}

// rankedLadder serves workloads that run faster the higher c's figure is.
// Performance prefers c's top class, and its second class too when the
// third is more than middleGapRatio behind, or when the fleet has models
// that do not publish the figure (unranked: the plugin cannot compute it
// for their architecture, which it does not know): every model that
// publishes it comes before them. Economy prefers the best class
// outside the top bandwidth class, bandwidth standing in for price (HBM
// parts cost several times GDDR ones), if that class is adequate; else it
// has no cheaper choice and prefers what performance does.
func rankedLadder(fleet *Fleet, c, bw fleetCut, policy prismv1alpha1.Policy) ([]tier, string) {
	if len(c.classes) < 2 {
		return nil, "one class: " + c.summaryOrNone()
	}
	top := tier{
		name:      tierName(c.fig, "top"),
		selectors: []selectorID{c.atLeast(0)},
		reason:    fmt.Sprintf("%s >= %d %s: %s", c.fig.attribute(), c.threshold(0), c.fig.unit(), c.share(0, 0)),
		models:    c.modelNames(0, 0),
		bound:     &lowerBound{c.fig, c.threshold(0)},
	}
	if policy == prismv1alpha1.PolicyEconomy {
		if t, ok := economyTier(fleet, c, bw); ok {
			return []tier{t, fits}, c.summary()
		}
		top.reason += "; no cheaper class within 2.5x"
		return []tier{top, fits}, c.summary()
	}
	ladder := []tier{top}
	if t, ok := rankedTier(fleet, c); ok {
		return append(ladder, t, fits), c.summary()
	}
	if len(c.classes) == 3 && float64(c.classes[1].low) >= middleGapRatio*float64(c.classes[2].high) {
		ladder = append(ladder, tier{
			name:      tierName(c.fig, "second"),
			selectors: []selectorID{c.atLeast(1)},
			reason:    fmt.Sprintf("%s >= %d %s: %s", c.fig.attribute(), c.threshold(1), c.fig.unit(), c.share(0, 1)),
			models:    c.modelNames(0, 1),
			bound:     &lowerBound{c.fig, c.threshold(1)},
		})
	}
	return append(ladder, fits), c.summary()
}

// rankedTier is the tier of every model that publishes c's figure, for a
// fleet cut in two classes whose other models publish none: without it,
// fits would offer the second class and the unranked models alike. The
// sweep on the Alibaba trace, whose K80s publish no FP32 figure, sent
// compute-bound jobs to them as often as to the P100s ahead of them
// (docs/simulator.md).
func rankedTier(fleet *Fleet, c fleetCut) (tier, bool) {
	if len(c.classes) != 2 || c.devices == fleetDevices(fleet) {
		return tier{}, false
	}
	g := snap(c.fig, 0, c.classes[1].low)
	if g < 0 {
		return tier{}, false
	}
	threshold := thresholdGrids[c.fig][g]
	return tier{
		name:      tierName(c.fig, "ranked"),
		selectors: []selectorID{thresholdSelector(c.fig, g, false)},
		reason:    fmt.Sprintf("%s >= %d %s: %s; ahead of the models that publish no %s", c.fig.attribute(), threshold, c.fig.unit(), c.share(0, 1), c.fig.attribute()),
		models:    c.modelNames(0, 1),
		bound:     &lowerBound{c.fig, threshold},
	}, true
}

// fleetDevices counts the fleet's devices.
func fleetDevices(fleet *Fleet) int {
	n := 0
	for _, m := range fleet.Models {
		n += m.Devices
	}
	return n
}

func economyTier(fleet *Fleet, c, bw fleetCut) (tier, bool) {
	if len(bw.classes) < 2 {
		return tier{}, false
	}
	expensive := map[string]bool{}
	for _, m := range bw.classes[0].models {
		expensive[m.Name] = true
	}
	var rest []Model
	for _, m := range fleet.Models {
		if !expensive[m.Name] {
			rest = append(rest, m)
		}
	}
	rc := cutFleet(rest, c.fig)
	if len(rc.classes) == 0 {
		return tier{}, false
	}
	best := rc.classes[0]
	if best.high*adequateShareDen < c.classes[0].high*adequateShareNum {
		return tier{}, false
	}
	t := tier{name: tierName(c.fig, "value"), models: rc.modelNames(0, 0)}
	below := fmt.Sprintf("%s < %d %s", figBandwidth.attribute(), bw.threshold(0), figBandwidth.unit())
	switch {
	case len(rc.classes) == 1:
		t.selectors = []selectorID{bw.below(0)}
		t.reason = fmt.Sprintf("%s: %s; leaves the top bandwidth class free", below, rc.share(0, 0))
	case slices.ContainsFunc(bw.classes[0].models, func(m Model) bool { return c.fig.of(m) >= rc.threshold(0) }):
		t.selectors = []selectorID{rc.atLeast(0), bw.below(0)}
		t.reason = fmt.Sprintf("%s >= %d %s and %s: %s; leaves the top bandwidth class free", c.fig.attribute(), rc.threshold(0), c.fig.unit(), below, rc.share(0, 0))
	default:
		// No model of the top bandwidth class reaches the lower bound, so
		// the upper bound selects nothing less on this fleet. Without it the
		// tier is a lower bound, which TierBoundsAsCapacity writes without
		// CEL. A model that has both and joins later is open to claims
		// written before it, as every fleet change is seen by later claims
		// only.
		t.selectors = []selectorID{rc.atLeast(0)}
		t.bound = &lowerBound{c.fig, rc.threshold(0)}
		t.reason = fmt.Sprintf("%s >= %d %s: %s; leaves the top bandwidth class free (none of it reaches that)", c.fig.attribute(), rc.threshold(0), c.fig.unit(), rc.share(0, 0))
	}
	return t, true
}

// economyLatencyLadder serves workloads bound by launch latency and clocks
// under economy: they take the bottom bandwidth class, the smallest (and
// cheapest) cards, since bandwidth separates HBM parts from GDDR ones
// better than FP32 does. Under the other policies they rank by FP32 as
// compute-bound jobs do: in the placement sweep, keeping them off the top
// class left fast GPUs idle while they ran 2-5x slower.
func economyLatencyLadder(bw fleetCut) ([]tier, string) {
	if len(bw.classes) < 2 {
		return nil, "one class: " + bw.summaryOrNone()
	}
	i := len(bw.cuts) - 1
	return []tier{{
		name:      tierName(figBandwidth, "bottom"),
		selectors: []selectorID{bw.below(i)},
		reason:    fmt.Sprintf("%s < %d %s: %s; keeps bigger cards free", bw.fig.attribute(), bw.threshold(i), bw.fig.unit(), bw.share(i+1, len(bw.classes)-1)),
		models:    bw.modelNames(i+1, len(bw.classes)-1),
	}, fits}, bw.summary()
}

func (c fleetCut) summaryOrNone() string {
	if len(c.classes) == 0 {
		return string(c.fig.attribute()) + ": no model publishes it"
	}
	return c.summary()
}

// tierName is the subrequest name: what the tier ranks by, and where.
func tierName(f figure, where string) string {
	return [...]string{"bandwidth", "fp32"}[f] + "-" + where
}
