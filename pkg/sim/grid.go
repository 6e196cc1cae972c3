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
	"math"
)

// gridPolicy is a policy of the packing or the sizing evaluation. The
// profiled ones read measured figures, so label noise changes what they do
// and their runs repeat at every noise level; the others run once per load.
type gridPolicy interface {
	~string
	profiled() bool
}

// gridCell is one policy at one load and noise: what a row of a packing or
// sizing table sums up over seeds.
type gridCell[P gridPolicy] struct {
	policy      P
	load, noise float64
}

// gridRuns lists a sweep's runs load by load and policy by policy, a
// profiled policy at every noise level, each cell once per seed.
func gridRuns[P gridPolicy, R any](policies []P, loads, noises []float64, seeds int, run func(c gridCell[P], seed uint64) R) []R {
	var runs []R
	for _, load := range loads {
		for _, p := range policies {
			cellNoises := []float64{0}
			if p.profiled() {
				cellNoises = noises
			}
			for _, n := range cellNoises {
				for seed := range seeds {
					runs = append(runs, run(gridCell[P]{p, load, n}, uint64(seed)))
				}
			}
		}
	}
	return runs
}

// mapParallel returns f of every input, computed on workers goroutines;
// once ctx is done it computes no more and returns ctx's error.
func mapParallel[In, Out any](ctx context.Context, workers int, in []In, f func(In) Out) ([]Out, error) {
	out := make([]Out, len(in))
	forEachParallel(ctx, workers, len(in), func(i int) { out[i] = f(in[i]) })
	return out, ctx.Err()
}

// gridSummary is a cell's figures over seeds. GPUs needed counts only the
// seeds whose stream some GPU count served; unserved counts the others.
type gridSummary[P gridPolicy] struct {
	cell       gridCell[P]
	figures    []Estimate
	gpusNeeded Estimate
	unserved   int
}

// summariseGrid groups outcomes by cell, in the order the cells first
// appear. figures gives an outcome's cell, the figures to estimate over
// seeds (the same number for every outcome) and the GPUs its stream needs
// (NaN where none served it).
func summariseGrid[P gridPolicy, O any](outs []O, figures func(O) (c gridCell[P], values []float64, gpusNeeded float64)) []gridSummary[P] {
	var order []gridCell[P]
	vals := map[gridCell[P]][][]float64{}
	needs := map[gridCell[P]][]float64{}
	unserved := map[gridCell[P]]int{}
	for _, o := range outs {
		c, values, need := figures(o)
		v, ok := vals[c]
		if !ok {
			order = append(order, c)
			v = make([][]float64, len(values))
		}
		for i, x := range values {
			v[i] = append(v[i], x)
		}
		vals[c] = v
		if math.IsNaN(need) {
			unserved[c]++
		} else {
			needs[c] = append(needs[c], need)
		}
	}
	out := make([]gridSummary[P], len(order))
	for i, c := range order {
		s := gridSummary[P]{cell: c, gpusNeeded: estimate(needs[c]), unserved: unserved[c]}
		for _, v := range vals[c] {
			s.figures = append(s.figures, estimate(v))
		}
		out[i] = s
	}
	return out
}

// noiseCell is a table's noise column: the level for a profiled policy,
// "-" for the others, which ignore it.
func noiseCell[P gridPolicy](p P, noise float64) string {
	if !p.profiled() {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*noise)
}

// seriesName names a plot's line: the policy, with the noise level for a
// profiled one.
func seriesName[P gridPolicy](p P, noise float64) string {
	if !p.profiled() {
		return string(p)
	}
	return fmt.Sprintf("%s, %.0f%% noise", p, 100*noise)
}

// gpusNeededCell is a table's GPUS NEEDED column: the estimate over the
// seeds some GPU count served, how many were never served, or "-" when the
// sweep did not look.
func gpusNeededCell(need Estimate, unserved int) string {
	switch {
	case need.N > 0 && unserved == 0:
		return need.String()
	case need.N > 0:
		return fmt.Sprintf("%s (%d seeds never)", need, unserved)
	case unserved > 0:
		return "never"
	}
	return "-"
}
