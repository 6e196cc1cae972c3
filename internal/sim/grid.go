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
	"slices"
	"strconv"
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

// GridSweep is a grid of packing or sizing runs.
type GridSweep[P gridPolicy] struct {
	Policies []P
	Loads    []float64
	// Noises apply to the profiled policies, which read measured figures
	// (prism, and by-memory when sizing); the others run once per load.
	Noises         []float64
	Seeds          int
	GPUs, Jobs     int
	Workers        int
	WithGPUsNeeded bool
}

// GridRun is one simulation of the packing or the sizing evaluation.
type GridRun[P gridPolicy] struct {
	Policy P
	// Load is the arrival rate as a share of what GPUs whole-GPU
	// allocation can serve: rate = Load × GPUs / mean work.
	Load  float64
	Noise float64
	Seed  uint64
	GPUs  int
	Jobs  int
}

// Runs lists the sweep's runs load by load and policy by policy, a
// profiled policy at every noise level, each cell once per seed.
func (s GridSweep[P]) Runs() []GridRun[P] {
	var runs []GridRun[P]
	for _, load := range s.Loads {
		for _, p := range s.Policies {
			cellNoises := []float64{0}
			if p.profiled() {
				cellNoises = s.Noises
			}
			for _, n := range cellNoises {
				for seed := range s.Seeds {
					runs = append(runs, GridRun[P]{Policy: p, Load: load, Noise: n, Seed: uint64(seed), GPUs: s.GPUs, Jobs: s.Jobs})
				}
			}
		}
	}
	return runs
}

// executeGrid runs a sweep in parallel: each run's result and, where the
// sweep asks for them, the GPUs its stream needs (NaN otherwise), joined
// by outcome.
func executeGrid[P gridPolicy, Res, Out any](ctx context.Context, s GridSweep[P], simulate func(GridRun[P]) Res, gpusNeeded func(GridRun[P]) float64, outcome func(Res, float64) Out) ([]Out, error) {
	return mapParallel(ctx, s.Workers, s.Runs(), func(r GridRun[P]) Out {
		res, need := simulate(r), math.NaN()
		if s.WithGPUsNeeded {
			need = gpusNeeded(r)
		}
		return outcome(res, need)
	})
}

// stream draws the run's jobs, of types job types (drawStream), at the
// rate its load sets.
func (r GridRun[P]) stream(types int) []streamJob {
	return drawStream(types, r.Jobs, r.Load*float64(r.GPUs), r.Seed)
}

// streamLog is what a simulation of the packing or the sizing evaluation
// records of its stream: when each job started and finished, and whether
// a start of it ran out of memory. Only the middle 60 % of arrivals
// counts: the first 20 % warm the GPUs up, the last 20 % drain.
type streamLog struct {
	jobs []streamJob
	// lo and hi bound the measured jobs; winStart and winEnd are their
	// first and last arrival.
	lo, hi           int
	winStart, winEnd float64
	started, finish  []float64
	oomed            []bool
	ooms             int
}

func newStreamLog(jobs []streamJob) *streamLog {
	lo, hi := len(jobs)/5, len(jobs)*4/5
	return &streamLog{jobs: jobs, lo: lo, hi: hi, winStart: jobs[lo].arrive, winEnd: jobs[hi-1].arrive,
		started: make([]float64, len(jobs)), finish: make([]float64, len(jobs)), oomed: make([]bool, len(jobs))}
}

// oom records that a start of job i ran out of memory.
func (l *streamLog) oom(i int) {
	l.ooms++
	l.oomed[i] = true
}

// window is the part of [now, now+dt] within the measured jobs' arrivals;
// empty where to <= from.
func (l *streamLog) window(now, dt float64) (from, to float64) {
	return math.Max(now, l.winStart), math.Min(now+dt, l.winEnd)
}

// oomsPer1000 is the out-of-memory starts per 1000 jobs of the stream.
func (l *streamLog) oomsPer1000() float64 {
	return 1000 * float64(l.ooms) / float64(len(l.jobs))
}

// judge gives, for each test, the share of the measured jobs it holds for,
// given a job's index, its slowdown ((finish − arrival) / work alone,
// waiting included) and its speed while running (work / run time); and
// the median and the 99th percentile of their slowdowns.
func (l *streamLog) judge(tests ...func(i int, slowdown, speed float64) bool) (shares []float64, median, p99 float64) {
	counts := make([]int, len(tests))
	var slow []float64
	for i := l.lo; i < l.hi; i++ {
		j := l.jobs[i]
		s := (l.finish[i] - j.arrive) / j.work
		slow = append(slow, s)
		speed := j.work / (l.finish[i] - l.started[i])
		for k, test := range tests {
			if test(i, s, speed) {
				counts[k]++
			}
		}
	}
	n := float64(l.hi - l.lo)
	shares = make([]float64, len(tests))
	for k, c := range counts {
		shares[k] = float64(c) / n
	}
	median, p99 = medianP99(slow)
	return shares, median, p99
}

// gpusNeeded is the fewest GPUs that serve the stream of run r (its rate
// fixed by Load × GPUs) with at most share of its jobs late, as late
// counts them on a copy of the stream; NaN when even 4 × GPUs do not.
func gpusNeeded[P gridPolicy](r GridRun[P], types int, share float64, late func(GridRun[P], []streamJob) float64) float64 {
	jobs := r.stream(types)
	return fewestGPUs(4*r.GPUs, func(n int) bool {
		rr := r
		rr.GPUs = n
		return late(rr, slices.Clone(jobs)) <= share
	})
}

// gridRow is a row of a packing or sizing table.
type gridRow[P gridPolicy] interface {
	*PackRow | *SliceRow
	cell() gridCell[P]
}

// RowAt is the row of rows for policy p at load and, for a profiled
// policy, noise (the others run at none); nil where there is none.
func RowAt[P gridPolicy, R gridRow[P]](rows []R, p P, load, noise float64) R {
	for _, r := range rows {
		if c := r.cell(); c.policy == p && c.load == load && (!p.profiled() || math.Abs(c.noise-noise) < 1e-9) {
			return r
		}
	}
	return nil
}

// mapParallel returns f of every input, computed on workers goroutines;
// once ctx is done it computes no more and returns ctx's error.
func mapParallel[In, Out any](ctx context.Context, workers int, in []In, f func(In) Out) ([]Out, error) {
	out := make([]Out, len(in))
	forEachParallel(ctx, workers, len(in), func(i int) { out[i] = f(in[i]) })
	return out, ctx.Err()
}

// summariseGrid groups outcomes by cell, in the order the cells first
// appear, and makes a row of each. figures gives an outcome's cell, the
// figures to estimate over seeds (the same number for every outcome) and
// the GPUs its stream needs (NaN where none served it). row gets the
// cell's estimates; GPUs needed counts only the seeds whose stream some
// GPU count served, and unserved counts the others.
func summariseGrid[P gridPolicy, O, R any](outs []O, figures func(O) (c gridCell[P], values []float64, gpusNeeded float64),
	row func(c gridCell[P], figures []Estimate, gpusNeeded Estimate, unserved int) R) []R {
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
	out := make([]R, len(order))
	for i, c := range order {
		var figs []Estimate
		for _, v := range vals[c] {
			figs = append(figs, estimate(v))
		}
		out[i] = row(c, figs, estimate(needs[c]), unserved[c])
	}
	return out
}

// distinctLoads lists the loads of rows, in the order they first appear.
func distinctLoads[R any](rows []R, load func(R) float64) []float64 {
	var loads []float64
	for _, r := range rows {
		if l := load(r); !slices.Contains(loads, l) {
			loads = append(loads, l)
		}
	}
	return loads
}

// writeTableVerdict prints a sweep's table, a blank line and its verdict,
// a line each.
func writeTableVerdict[R any](w io.Writer, rows []R, table func(io.Writer, []R) error, verdict func([]R) []string) error {
	if err := table(w, rows); err != nil {
		return err
	}
	fmt.Fprintln(w)
	for _, v := range verdict(rows) {
		fmt.Fprintln(w, v)
	}
	return nil
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

// agreeing formats v with prec decimals, or more where prec would round it
// across the line a verdict draws, so that the printed figure never
// contradicts the verdict: test is the verdict's test, and the figure is
// printed with the fewest decimals at which test says of it what it says
// of v (1.299 against a goal of 1.3 prints as 1.299, not 1.30).
func agreeing(v float64, prec int, test func(float64) bool) string {
	want := test(v)
	for p := prec; p <= 15; p++ {
		s := strconv.FormatFloat(v, 'f', p, 64)
		if x, err := strconv.ParseFloat(s, 64); err == nil && test(x) == want {
			return s
		}
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
