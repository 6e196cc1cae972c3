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

package sim

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
)

// InterferenceTarget is the acceptance target of the packing evaluation:
// at most this share of jobs below 80 % of their speed alone.
const InterferenceTarget = 0.05

// PackSweep is a grid of packing runs; its noises apply to prism alone.
type PackSweep = GridSweep[PackPolicy]

// PackOutcome is one run's result and, when asked for, the GPUs its stream
// needs.
type PackOutcome struct {
	PackResult
	GPUsNeeded float64
}

// Execute runs the sweep in parallel.
func (d *PackingData) Execute(ctx context.Context, s PackSweep) ([]PackOutcome, error) {
	return executeGrid(ctx, s, d.Simulate, func(r PackRun) float64 { return d.GPUsNeeded(r, InterferenceTarget) },
		func(res PackResult, need float64) PackOutcome { return PackOutcome{res, need} })
}

// PackRow is one policy at one load and noise, over seeds.
type PackRow struct {
	Policy                                       PackPolicy
	Load, Noise                                  float64
	Goodput, Below80, Below90, Median, P99, OOMs Estimate
	Paired, Late                                 Estimate
	// GPUsNeeded is over the seeds whose stream some GPU count served;
	// Unserved counts the others.
	GPUsNeeded Estimate
	Unserved   int
}

func (r *PackRow) cell() gridCell[PackPolicy] { return gridCell[PackPolicy]{r.Policy, r.Load, r.Noise} }

// MeetsTarget says whether the mean share of jobs below 80 % is within
// the interference target.
func (r *PackRow) MeetsTarget() bool { return meetsTarget(r.Below80.Mean) }

func meetsTarget(below80 float64) bool { return below80 <= InterferenceTarget+1e-9 }

// below80Pct prints a share below 80 % in per cent with one decimal, or
// more where one would round it across the interference target.
func below80Pct(share float64) string {
	return agreeing(100*share, 1, func(pct float64) bool { return meetsTarget(pct / 100) })
}

// SummarisePacking groups outcomes by policy, load and noise, in sweep
// order.
func SummarisePacking(outs []PackOutcome) []*PackRow {
	figures := func(o PackOutcome) (gridCell[PackPolicy], []float64, float64) {
		return gridCell[PackPolicy]{o.Policy, o.Load, o.Noise}, []float64{o.Goodput, o.Below80, o.Below90, o.Median, o.P99, o.OOMs, o.Paired, o.Late}, o.GPUsNeeded
	}
	return summariseGrid(outs, figures, func(c gridCell[PackPolicy], f []Estimate, need Estimate, unserved int) *PackRow {
		return &PackRow{Policy: c.policy, Load: c.load, Noise: c.noise,
			Goodput: f[0], Below80: f[1], Below90: f[2], Median: f[3], P99: f[4], OOMs: f[5], Paired: f[6], Late: f[7],
			GPUsNeeded: need, Unserved: unserved}
	})
}

// WritePackingTable prints one row per policy, load and noise: means over
// seeds with 95 % confidence half-widths.
func WritePackingTable(w io.Writer, rows []*PackRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOAD\tPOLICY\tNOISE\tGOODPUT/GPU\t<80%\t<90%\tMEDIAN SLOWDOWN\tP99 SLOWDOWN\tPAIRED\tOOM/1000\tGPUS NEEDED\tTARGET")
	for _, r := range rows {
		target := "misses"
		if r.MeetsTarget() {
			target = "meets"
		}
		below80 := fmt.Sprintf("%s%% ±%.1f", below80Pct(r.Below80.Mean), 100*r.Below80.Half)
		fmt.Fprintf(tw, "%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", 100*r.Load, r.Policy, noiseCell(r.Policy, r.Noise),
			r.Goodput, below80, pct(r.Below90), r.Median, r.P99, pct(r.Paired), r.OOMs, gpusNeededCell(r.GPUsNeeded, r.Unserved), target)
	}
	return tw.Flush()
}

func pct(x Estimate) string {
	return fmt.Sprintf("%.1f%% ±%.1f", 100*x.Mean, 100*x.Half)
}

// PackingVerdict states, per load, the acceptance goal: Prism's goodput
// per GPU against the best profile-free policy that meets the interference
// target (goal ≥ 1.3×), against whole-GPU allocation (≥ 1.5×), and with 20 %
// profile noise against the best profile-free policy (≥ 1.15×). A ratio or
// share is printed with two (one) decimals, or more where fewer would
// round it across its goal.
func PackingVerdict(rows []*PackRow) []string {
	var out []string
	loads := distinctLoads(rows, func(r *PackRow) float64 { return r.Load })
	find := func(p PackPolicy, load, noise float64) *PackRow { return RowAt(rows, p, load, noise) }
	for _, load := range loads {
		var best *PackRow
		for _, r := range rows {
			if r.Load == load && r.Policy.profileFree() && r.MeetsTarget() && (best == nil || r.Goodput.Mean > best.Goodput.Mean) {
				best = r
			}
		}
		whole := find(PackWhole, load, 0)
		line := fmt.Sprintf("load %.0f%%:", 100*load)
		for _, g := range []struct {
			noise, goal float64
		}{{0, 1.3}, {0.2, 1.15}} {
			prism := find(PackPrism, load, g.noise)
			if prism == nil {
				continue
			}
			line += fmt.Sprintf(" prism at %.0f%% noise goodput %.2f, <80%% %s%% (target %s)", 100*g.noise, prism.Goodput.Mean, below80Pct(prism.Below80.Mean), map[bool]string{true: "met", false: "missed"}[prism.MeetsTarget()])
			if best == nil {
				line += "; no profile-free policy meets the target;"
				continue
			}
			ratio := prism.Goodput.Mean / best.Goodput.Mean
			line += fmt.Sprintf("; vs best profile-free meeting it (%s %.2f): %sx (goal >= %.2fx: %s);", best.Policy, best.Goodput.Mean, ratioAgainst(ratio, g.goal), g.goal,
				holds(prism.MeetsTarget() && ratio >= g.goal))
			if whole != nil && g.noise == 0 {
				ratio := prism.Goodput.Mean / whole.Goodput.Mean
				line += fmt.Sprintf(" vs whole-gpu: %sx (goal >= 1.5x: %s);", ratioAgainst(ratio, 1.5), holds(prism.MeetsTarget() && ratio >= 1.5))
			}
		}
		out = append(out, line)
	}
	return out
}

// ratioAgainst prints a goodput ratio with two decimals, or more where two
// would round it across goal.
func ratioAgainst(ratio, goal float64) string {
	return agreeing(ratio, 2, func(x float64) bool { return x >= goal })
}

func holds(ok bool) string {
	if ok {
		return "holds"
	}
	return "fails"
}
