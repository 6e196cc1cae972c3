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

package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"text/tabwriter"

	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// ShareRuleVariants are the share-sizing rules the share-rule phase
// judges: the one that ships and the neighbours of each of its
// parameters. Only the request's headroom and the heavy cut reach the
// packing evaluation, whose data has one utilisation figure a job, so
// that a job's request is its limit there: a request's headroom above the
// limit's is cut to the limit, and the stricter variants widen both.
func ShareRuleVariants() []rewrite.ShareRule {
	d := rewrite.DefaultShareRule
	with := func(request, limit rewrite.Headroom, heavy int64) rewrite.ShareRule {
		return rewrite.ShareRule{RequestHeadroom: request, PeakHeadroom: limit, HeavyPercent: heavy}
	}
	rules := []rewrite.ShareRule{
		with(rewrite.Headroom{}, d.PeakHeadroom, d.HeavyPercent),
		with(rewrite.Headroom{MinMilli: 5_000}, d.PeakHeadroom, d.HeavyPercent),
		with(rewrite.Headroom{MinMilli: 10_000}, d.PeakHeadroom, d.HeavyPercent),
	}
	for _, h := range []rewrite.Headroom{{MinMilli: 10_000, Divisor: 4}, d.RequestHeadroom, {MinMilli: 15_000, Divisor: 3}, {MinMilli: 10_000, Divisor: 2}} {
		rules = append(rules, with(h, h, d.HeavyPercent))
	}
	for _, heavy := range []int64{60, 65, 70, 75, 100} {
		rules = append(rules, with(d.RequestHeadroom, d.PeakHeadroom, heavy))
	}
	return rules
}

// ShareRuleFitGPU is the GPU model whose data chooses the rule; the
// others judge the choice.
const ShareRuleFitGPU = "p100"

// ShareRuleGPUs are the models judged: the fit and the held-out ones.
var ShareRuleGPUs = []string{ShareRuleFitGPU, "v100", "h100-mps"}

// shareRuleSweep is the packing evaluation's grid for one rule: prism
// alone, four loads, with labels right and 20 % wrong.
func shareRuleSweep() sim.PackSweep {
	return sim.PackSweep{Policies: []sim.PackPolicy{sim.PackPrism}, Loads: []float64{0.3, 0.5, 0.7, 0.9}, Noises: []float64{0, 0.2},
		Seeds: 10, GPUs: 32, Jobs: 2000, Workers: 2}
}

// ruleOutcome is one rule on one GPU model over the sweep.
type ruleOutcome struct {
	// Goodput is the mean goodput per busy GPU at no noise, over loads;
	// Worst80 the largest share of jobs below 80 % at any load and noise.
	Goodput, Worst80 float64
}

func (o ruleOutcome) meets() bool { return o.Worst80 <= sim.InterferenceTarget+1e-9 }

// ShareRule judges each rule of ShareRuleVariants on the shipped packing
// data, chooses the one with the most goodput that meets the interference
// target everywhere on ShareRuleFitGPU, and judges that choice on the
// other models: a held-out split, so that the data that chooses does not
// also judge. It writes the sensitivity table and the split to w.
func ShareRule(ctx context.Context, repo string, w io.Writer) ([]Row, error) {
	rules := ShareRuleVariants()
	j, err := judgeShareRules(ctx, repo, rules)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(w, "Share-sizing rule sensitivity: packing goodput per busy GPU (mean over loads 30-90 %%, labels right) and the most jobs below 80 %% of alone at any load, labels right or 20 %% wrong; the target is at most %.0f %%.\n", 100*sim.InterferenceTarget)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "RULE")
	for _, gpu := range ShareRuleGPUs {
		fmt.Fprintf(tw, "\t%s GOODPUT\t%s WORST <80%%", gpu, gpu)
	}
	fmt.Fprintln(tw)
	for i, r := range rules {
		name := r.String()
		if r == rewrite.DefaultShareRule {
			name += " (ships)"
		}
		fmt.Fprint(tw, name)
		for _, gpu := range ShareRuleGPUs {
			o := j.outcomes[i][gpu]
			mark := ""
			if !o.meets() {
				mark = " misses"
			}
			fmt.Fprintf(tw, "\t%.3f\t%.1f%%%s", o.Goodput, 100*o.Worst80, mark)
		}
		fmt.Fprintln(tw)
	}
	fmt.Fprint(tw, "oracle")
	for _, gpu := range ShareRuleGPUs {
		fmt.Fprintf(tw, "\t%.3f\t-", j.oracle[gpu])
	}
	fmt.Fprintln(tw)
	if err := tw.Flush(); err != nil {
		return nil, err
	}

	chosen := j.choose()
	if chosen < 0 {
		fmt.Fprintf(w, "Fit on %s: no rule meets the target there.\n", ShareRuleFitGPU)
		return nil, nil
	}
	verdict := "the rule that ships"
	if rules[chosen] != rewrite.DefaultShareRule {
		verdict = "NOT the rule that ships"
	}
	fmt.Fprintf(w, "Fit on %s: the most goodput within the target everywhere is %s, %s.\n", ShareRuleFitGPU, rules[chosen], verdict)
	var rows []Row
	for _, gpu := range ShareRuleGPUs[1:] {
		o, oracle := j.outcomes[chosen][gpu], j.oracle[gpu]
		gain := "no gain"
		if oracle > 1 {
			gain = fmt.Sprintf("%.0f %% of the oracle's gain over whole-GPU allocation", 100*(o.Goodput-1)/(oracle-1))
		}
		target := "meets the target"
		if !o.meets() {
			target = fmt.Sprintf("misses the target (%.1f %% of jobs below 80 %%)", 100*o.Worst80)
		}
		fmt.Fprintf(w, "Judged on %s (held out): goodput %.3f, oracle %.3f: %s; %s.\n", gpu, o.Goodput, oracle, gain, target)
		rows = append(rows, NewRow("share-rule", gpu+", held out (rule fitted on "+ShareRuleFitGPU+")", "goodput per busy GPU, mean over loads", "x alone",
			"oracle", oracle, "prism", o.Goodput, fmt.Sprintf("worst <80%%: %.1f%%", 100*o.Worst80)))
	}
	return rows, nil
}

// ruleJudgement is every rule's outcome on every model of ShareRuleGPUs,
// and the oracle's goodput there.
type ruleJudgement struct {
	outcomes []map[string]ruleOutcome
	oracle   map[string]float64
}

func judgeShareRules(ctx context.Context, repo string, rules []rewrite.ShareRule) (*ruleJudgement, error) {
	dir := filepath.Join(repo, "test", "bench", "data")
	m, err := sim.ReadMeasured(filepath.Join(dir, "jobs.csv"), filepath.Join(dir, "pairs.csv"), filepath.Join(dir, "slices.csv"))
	if err != nil {
		return nil, err
	}
	j := &ruleJudgement{outcomes: make([]map[string]ruleOutcome, len(rules)), oracle: map[string]float64{}}
	for i := range rules {
		j.outcomes[i] = map[string]ruleOutcome{}
	}
	for _, gpu := range ShareRuleGPUs {
		d, err := m.ForGPU(gpu, sim.GPUMemoryMiB[gpu])
		if err != nil {
			return nil, err
		}
		s := shareRuleSweep()
		s.Policies = []sim.PackPolicy{sim.PackOracle}
		outs, err := d.Execute(ctx, s)
		if err != nil {
			return nil, err
		}
		j.oracle[gpu] = meanGoodput(sim.SummarisePacking(outs))
		for i, r := range rules {
			outs, err := d.WithShareRule(r).Execute(ctx, shareRuleSweep())
			if err != nil {
				return nil, err
			}
			table := sim.SummarisePacking(outs)
			o := ruleOutcome{Goodput: meanGoodput(table)}
			for _, row := range table {
				o.Worst80 = math.Max(o.Worst80, row.Below80.Mean)
			}
			j.outcomes[i][gpu] = o
		}
	}
	return j, nil
}

// choose is the index of the rule with the most goodput on ShareRuleFitGPU
// among those that meet the target there, or -1.
func (j *ruleJudgement) choose() int {
	chosen := -1
	for i, o := range j.outcomes {
		if fit := o[ShareRuleFitGPU]; fit.meets() && (chosen < 0 || fit.Goodput > j.outcomes[chosen][ShareRuleFitGPU].Goodput) {
			chosen = i
		}
	}
	return chosen
}

// meanGoodput is the mean over a table's rows at no noise.
func meanGoodput(table []*sim.PackRow) float64 {
	var sum float64
	var n int
	for _, r := range table {
		if r.Noise == 0 {
			sum += r.Goodput.Mean
			n++
		}
	}
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}
