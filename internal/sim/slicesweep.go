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
	"math"
	"strings"
	"text/tabwriter"
)

// SliceSweep is a grid of sizing runs; its noises apply to by-memory and
// prism.
type SliceSweep = GridSweep[SlicePolicy]

// SliceOutcome is one run's result and, when asked for, the GPUs its
// stream needs.
type SliceOutcome struct {
	SliceResult
	GPUsNeeded float64
}

// Execute runs the sweep in parallel.
func (d *SlicingData) Execute(ctx context.Context, s SliceSweep) ([]SliceOutcome, error) {
	return executeGrid(ctx, s, d.Simulate, d.GPUsNeeded,
		func(res SliceResult, need float64) SliceOutcome { return SliceOutcome{res, need} })
}

// SliceRow is one policy at one load and noise, over seeds.
type SliceRow struct {
	Policy                                              SlicePolicy
	Load, Noise                                         float64
	Goodput, Below80, Median, P99, Late, OOMs, Sevenths Estimate
	// GPUsNeeded is over the seeds whose stream some GPU count served;
	// Unserved counts the others.
	GPUsNeeded Estimate
	Unserved   int
}

func (r *SliceRow) cell() gridCell[SlicePolicy] {
	return gridCell[SlicePolicy]{r.Policy, r.Load, r.Noise}
}

// SummariseSlicing groups outcomes by policy, load and noise, in sweep
// order.
func SummariseSlicing(outs []SliceOutcome) []*SliceRow {
	figures := func(o SliceOutcome) (gridCell[SlicePolicy], []float64, float64) {
		return gridCell[SlicePolicy]{o.Policy, o.Load, o.Noise}, []float64{o.Goodput, o.Below80, o.Median, o.P99, o.Late, o.OOMs, o.Sevenths}, o.GPUsNeeded
	}
	return summariseGrid(outs, figures, func(c gridCell[SlicePolicy], f []Estimate, need Estimate, unserved int) *SliceRow {
		return &SliceRow{Policy: c.policy, Load: c.load, Noise: c.noise,
			Goodput: f[0], Below80: f[1], Median: f[2], P99: f[3], Late: f[4], OOMs: f[5], Sevenths: f[6],
			GPUsNeeded: need, Unserved: unserved}
	})
}

// WriteSlicingTable prints one row per policy, load and noise: means over
// seeds with 95 % confidence half-widths.
func WriteSlicingTable(w io.Writer, rows []*SliceRow) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LOAD\tPOLICY\tNOISE\tSLICE (7THS)\tGOODPUT/GPU\t<80%\tMEDIAN SLOWDOWN\tP99 SLOWDOWN\tOOM/1000\tGPUS NEEDED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", 100*r.Load, r.Policy, noiseCell(r.Policy, r.Noise),
			r.Sevenths, r.Goodput, pct(r.Below80), r.Median, r.P99, r.OOMs, gpusNeededCell(r.GPUsNeeded, r.Unserved))
	}
	return tw.Flush()
}

// SlicingVerdict states, per load, what the public MIG measurements
// predict: sizing by memory near 2.7× median slowdown, sizing by measured use
// near 1.3×, with about 15 % fewer GPUs than whole-GPU allocation.
func SlicingVerdict(rows []*SliceRow) []string {
	loads := distinctLoads(rows, func(r *SliceRow) float64 { return r.Load })
	find := func(p SlicePolicy, load float64) *SliceRow { return RowAt(rows, p, load, 0) }
	var out []string
	for _, load := range loads {
		line := fmt.Sprintf("load %.0f%%: median slowdown", 100*load)
		for _, p := range SlicePolicies {
			if r := find(p, load); r != nil {
				line += fmt.Sprintf(" %s %.2fx,", p, r.Median.Mean)
			}
		}
		whole := find(SliceWhole, load)
		for _, p := range []SlicePolicy{SlicePrism, SliceOracle, SliceMemory} {
			r := find(p, load)
			if r == nil || whole == nil {
				continue
			}
			line += " " + gpusNeededVersusWhole(p, r.GPUsNeeded, whole.GPUsNeeded)
		}
		out = append(out, line)
	}
	return out
}

// gpusNeededVersusWhole compares the GPUs policy p needs with what
// whole-GPU allocation needs: the same number, or how many per cent fewer
// or more, printed with the decimals it takes not to read 0 %.
func gpusNeededVersusWhole(p SlicePolicy, need, whole Estimate) string {
	if need.N == 0 || whole.N == 0 {
		return fmt.Sprintf("%s GPUs needed vs whole-gpu: not served;", p)
	}
	if math.Abs(need.Mean-whole.Mean) < 1e-9 {
		return fmt.Sprintf("%s needs the same number of GPUs as whole-gpu;", p)
	}
	more, pct := "more", 100*(need.Mean/whole.Mean-1)
	if pct < 0 {
		more, pct = "fewer", -pct
	}
	return fmt.Sprintf("%s needs %s%% %s GPUs than whole-gpu;", p, agreeing(pct, 0, func(x float64) bool { return x > 0 }), more)
}

// WriteSlicingReport prints what the evaluation ran on, each job type's
// choices at no noise, the table and the verdict.
func WriteSlicingReport(w io.Writer, d *SlicingData, s SliceSweep, rows []*SliceRow) error {
	m := d.Model
	fmt.Fprintf(w, "MIG sizing on %s: %d job types with slice speeds; profiles %s (%d compute, %d memory slices; placements as NVML gives them, so fragmentation counts).\n",
		d.GPU, len(d.Jobs), profileNames(m), m.ComputeSlices, m.MemorySlices)
	fmt.Fprintf(w, "Stream: %d jobs a run (middle 60%% measured) on %d GPUs, each cut as jobs come (best fit); %d seeds; 95%% intervals. A slice the judge lists as did not fit (speed 0) runs out of memory: the job reruns on a whole GPU.\n",
		s.Jobs, s.GPUs, s.Seeds)
	var unmeasured []string
	var notMeasured int
	for i, profiles := range d.Unmeasured() {
		if len(profiles) > 0 {
			unmeasured = append(unmeasured, fmt.Sprintf("%s on %s", d.Jobs[i].Job, strings.Join(profiles, ", ")))
			notMeasured += len(profiles)
		}
	}
	if len(unmeasured) > 0 {
		fmt.Fprintf(w, "Not measured: %s of %s (no row or an empty speed in the slices file; no policy chooses one, a job whose rule picks one gets the next larger slice it was measured on): %s.\n",
			count(notMeasured, "slice"), count(len(unmeasured), "job type"), strings.Join(unmeasured, "; "))
	}
	if len(d.Clamped) > 0 {
		fmt.Fprintln(w, clampedLine(d.Clamped))
	}
	fmt.Fprintf(w, "Oracle: smallest slice at >= %.0f%% of whole-GPU speed. GPUS NEEDED: fewest GPUs serving the same stream with at most %.0f%% of jobs slowed beyond %.0fx (JCT / work alone on a whole GPU, waiting included).\n\n",
		100*SliceSpeedTarget, 100*SliceLateShare, SliceLateSlowdown)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB\tUTIL%\tMEM MIB\tBY-MEMORY\tPRISM\tORACLE\tSPEED BY-MEMORY\tSPEED PRISM")
	for i, j := range d.Jobs {
		var k [3]int
		var cell [3]string
		for x, p := range []SlicePolicy{SliceMemory, SlicePrism, SliceOracle} {
			var unmeasured int
			k[x], unmeasured = d.choose(p, i, 1)
			cell[x] = m.Profiles[k[x]].Name
			if unmeasured >= 0 {
				cell[x] += fmt.Sprintf(" (%s not measured)", m.Profiles[unmeasured].Name)
			}
		}
		fmt.Fprintf(tw, "%s\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%s\n", j.Job, j.UtilPct, j.MemMiB,
			cell[0], cell[1], cell[2], speedCell(d.speed[i][k[0]]), speedCell(d.speed[i][k[1]]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return writeTableVerdict(w, rows, WriteSlicingTable, SlicingVerdict)
}

func speedCell(v float64) string {
	if v == 0 {
		return "oom"
	}
	return fmt.Sprintf("%.2f", v)
}
