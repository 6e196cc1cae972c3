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
	"strings"
	"sync"
	"text/tabwriter"
)

// Sweep is a grid of runs.
type Sweep struct {
	Policies []Policy
	Loads    []float64
	// Noises apply to the Prism policies; the others run once per load.
	Noises []float64
	Seeds  int
	// Workers run simulations in parallel.
	Workers int
	// StrictTiers: see Run.
	StrictTiers bool
}

// Runs lists the sweep's runs, the null-speed reference first at every
// load.
func (s Sweep) Runs() []Run {
	var runs []Run
	for _, load := range s.Loads {
		for seed := range s.Seeds {
			runs = append(runs, Run{Policy: Kube, Load: load, Seed: uint64(seed), NullSpeed: true, StrictTiers: s.StrictTiers})
			for _, p := range s.Policies {
				noises := []float64{0}
				if p.prism() {
					noises = s.Noises
				}
				for _, n := range noises {
					runs = append(runs, Run{Policy: p, Load: load, Noise: n, Seed: uint64(seed), StrictTiers: s.StrictTiers})
				}
			}
		}
	}
	return runs
}

// forEachParallel calls f(0) to f(n-1) on workers goroutines (at least
// one) and returns once every call that started has ended; after ctx is
// done it starts no more.
func forEachParallel(ctx context.Context, workers, n int, f func(i int)) {
	var wg sync.WaitGroup
	next := make(chan int)
	for range max(1, workers) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	for i := range n {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
}

// Execute runs every configuration of the sweep.
func (e *Env) Execute(ctx context.Context, s Sweep) ([]*Result, error) {
	runs := s.Runs()
	out := make([]*Result, len(runs))
	errs := make([]error, len(runs))
	forEachParallel(ctx, s.Workers, len(runs), func(i int) {
		out[i], errs[i] = e.Simulate(runs[i])
	})
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	for i, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("%s at load %.2f noise %.2f seed %d: %w", runs[i].Policy, runs[i].Load, runs[i].Noise, runs[i].Seed, err)
		}
	}
	return out, nil
}

// Estimate is a mean over seeds with the half-width of its 95 %
// confidence interval (Student's t).
type Estimate struct {
	Mean, Half float64
	N          int
}

func (x Estimate) String() string {
	return fmt.Sprintf("%s ±%s", num(x.Mean), num(x.Half))
}

func num(v float64) string {
	switch a := math.Abs(v); {
	case a >= 1e4:
		return fmt.Sprintf("%.3gk", v/1e3)
	case a >= 100:
		return fmt.Sprintf("%.0f", v)
	case a >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// t975 are Student's t 97.5 % quantiles for 1..30 degrees of freedom.
var t975 = []float64{12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
	2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
	2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042}

func estimate(v []float64) Estimate {
	n := len(v)
	if n == 0 {
		return Estimate{}
	}
	var sum float64
	for _, x := range v {
		sum += x
	}
	mean := sum / float64(n)
	if n == 1 {
		return Estimate{Mean: mean, N: 1}
	}
	var ss float64
	for _, x := range v {
		ss += (x - mean) * (x - mean)
	}
	t := 1.96
	if n-1 <= len(t975) {
		t = t975[n-2]
	}
	return Estimate{Mean: mean, Half: t * math.Sqrt(ss/float64(n-1)/float64(n)), N: n}
}

// Row is one cell of the sweep table: a policy (or "null-speed") at one
// load and noise, summarised over seeds.
type Row struct {
	Policy                                         string
	Load, Noise                                    float64
	Median, P99, MeanJCT, MultiWait, Frag, Util    Estimate
	OnModel                                        [numModels]float64
	medians, p99s, jcts, waits, frags, utils, mods [][]float64
}

// Summarise groups results by policy, load and noise.
func Summarise(results []*Result) []*Row {
	var rows []*Row
	index := map[string]*Row{}
	for _, r := range results {
		name := string(r.Policy)
		if r.NullSpeed {
			name = "null-speed"
		}
		key := fmt.Sprintf("%s|%g|%g", name, r.Load, r.Noise)
		row, ok := index[key]
		if !ok {
			row = &Row{Policy: name, Load: r.Load, Noise: r.Noise, medians: make([][]float64, 1), p99s: make([][]float64, 1),
				jcts: make([][]float64, 1), waits: make([][]float64, 1), frags: make([][]float64, 1), utils: make([][]float64, 1), mods: make([][]float64, numModels)}
			index[key] = row
			rows = append(rows, row)
		}
		row.medians[0] = append(row.medians[0], r.MedianSlowdown)
		row.p99s[0] = append(row.p99s[0], r.P99Slowdown)
		row.jcts[0] = append(row.jcts[0], r.MeanJCT)
		row.waits[0] = append(row.waits[0], r.MultiGPUWait)
		row.frags[0] = append(row.frags[0], r.Fragmentation)
		row.utils[0] = append(row.utils[0], r.Utilisation)
		total := 0
		for _, c := range r.OnModel {
			total += c
		}
		for m, c := range r.OnModel {
			row.mods[m] = append(row.mods[m], float64(c)/float64(max(total, 1)))
		}
	}
	for _, row := range rows {
		row.Median, row.P99, row.MeanJCT = estimate(row.medians[0]), estimate(row.p99s[0]), estimate(row.jcts[0])
		row.MultiWait, row.Frag, row.Util = estimate(row.waits[0]), estimate(row.frags[0]), estimate(row.utils[0])
		for m := range numModels {
			row.OnModel[m] = estimate(row.mods[m]).Mean
		}
	}
	slices.SortStableFunc(rows, func(a, b *Row) int {
		switch {
		case a.Load != b.Load:
			return cmpFloat(a.Load, b.Load)
		case a.Policy != b.Policy:
			return policyOrder(a.Policy) - policyOrder(b.Policy)
		}
		return cmpFloat(a.Noise, b.Noise)
	})
	return rows
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func policyOrder(name string) int {
	if name == "null-speed" {
		return -1
	}
	return slices.Index(Policies, Policy(name))
}

// WriteSweepTable prints one line per policy, load and noise.
func WriteSweepTable(w io.Writer, rows []*Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "load\tpolicy\tnoise\tmedian slowdown\tp99 slowdown\tmean JCT (s)\tmulti-GPU wait (s)\tfragmentation\tutil\tK80/P100/V100\t")
	for _, r := range rows {
		noise := "-"
		if Policy(r.Policy).prism() {
			noise = fmt.Sprintf("%.0f%%", 100*r.Noise)
		}
		fmt.Fprintf(tw, "%.0f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%.0f/%.0f/%.0f%%\t\n", 100*r.Load, r.Policy, noise,
			r.Median, r.P99, r.MeanJCT, r.MultiWait, r.Frag, 100*r.Util.Mean, 100*r.OnModel[K80], 100*r.OnModel[P100], 100*r.OnModel[V100])
	}
	return tw.Flush()
}

// tolerance is how close two means must be to count as equal in Verdict:
// a median of exactly 1 computed along two paths differs in the last bits.
const tolerance = 1.005

func noWorse(a, b float64) bool { return a <= b*tolerance }

// placementGoal is the goal of the trace replay: the best Prism
// policy's median slowdown placementGoal times better than the best
// profile-free policy's.
const placementGoal = 1.3

// Verdict checks the placement goal (a median slowdown 1.3x better than
// the best profile-free policy's) on the summarised rows at loads of at
// least minLoad and returns one line per load: the best Prism policy's
// median slowdown against the best profile-free one (kube, blind,
// fastest-free, prefer-hbm), its p99 slowdown and multi-GPU wait against
// blind, and the best Prism median at 20 % wrong labels against the best
// profile-free one.
func Verdict(rows []*Row, minLoad float64) []string {
	var out []string
	loads := map[float64]bool{}
	for _, r := range rows {
		if r.Load >= minLoad {
			loads[r.Load] = true
		}
	}
	keys := make([]float64, 0, len(loads))
	for l := range loads {
		keys = append(keys, l)
	}
	slices.Sort(keys)
	for _, load := range keys {
		var bestPrism, bestPrism20, bestFree, blind *Row
		for _, r := range rows {
			if r.Load != load {
				continue
			}
			p := Policy(r.Policy)
			switch {
			case p.prism() && r.Noise == 0 && (bestPrism == nil || r.Median.Mean < bestPrism.Median.Mean):
				bestPrism = r
			case p.prism() && math.Abs(r.Noise-0.2) < 1e-9 && (bestPrism20 == nil || r.Median.Mean < bestPrism20.Median.Mean):
				bestPrism20 = r
			case (p == Kube || p == Blind || p == FastestFree || p == PreferHBM) && (bestFree == nil || r.Median.Mean < bestFree.Median.Mean):
				bestFree = r
			}
			if p == Blind {
				blind = r
			}
		}
		if bestPrism == nil || bestFree == nil || blind == nil {
			continue
		}
		var b strings.Builder
		ratio := bestFree.Median.Mean / bestPrism.Median.Mean
		fmt.Fprintf(&b, "load %.0f%%: best Prism %s median %s vs best profile-free %s %s: %sx (goal >= %.1fx: %s)",
			100*load, bestPrism.Policy, num(bestPrism.Median.Mean), bestFree.Policy, num(bestFree.Median.Mean),
			ratioAgainst(ratio, placementGoal), placementGoal, yes(ratio >= placementGoal-1e-9))
		fmt.Fprintf(&b, "; p99 %s vs blind %s (%s); multi-GPU wait %s vs blind %s (%s)",
			num(bestPrism.P99.Mean), num(blind.P99.Mean), yes(noWorse(bestPrism.P99.Mean, blind.P99.Mean)),
			num(bestPrism.MultiWait.Mean), num(blind.MultiWait.Mean), yes(noWorse(bestPrism.MultiWait.Mean, blind.MultiWait.Mean)))
		if bestPrism20 != nil {
			// No worse than the best profile-free policy: a gain of at
			// least 1 within the tolerance of equal means.
			gain := bestFree.Median.Mean / bestPrism20.Median.Mean
			fmt.Fprintf(&b, "; at 20%% wrong labels %s median %s, gain over best profile-free %sx (%s)",
				bestPrism20.Policy, num(bestPrism20.Median.Mean), ratioAgainst(gain, 1/tolerance), yes(gain >= 1/tolerance-1e-9))
		}
		out = append(out, b.String())
	}
	return out
}

func yes(ok bool) string {
	if ok {
		return "holds"
	}
	return "fails"
}
