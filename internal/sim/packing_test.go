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
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

func TestSizeShareFollowsTheAgreedRule(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name          string
		util, peakMiB float64
		memKnown      bool
		want          gpuv1alpha1.Share
		ok            bool
	}{
		// 20 + max(10, 6.7) = 30; 2000 × 1.2 + 512 = 2912 → 3 GiB.
		{"light", 20, 2000, true, gpuv1alpha1.Share{ComputePercent: 30, MemoryBytes: 3072 << 20}, true},
		// 50 + 16.7 = 66.7 → 70; 6000 × 1.2 + 512 = 7712 → 8 GiB.
		{"medium", 50, 6000, true, gpuv1alpha1.Share{ComputePercent: 70, MemoryBytes: 8192 << 20}, true},
		// 4 + 10 = 14 → 15; 100 MiB → 632 → floor 1 GiB.
		{"tiny", 4, 100, true, gpuv1alpha1.Share{ComputePercent: 15, MemoryBytes: 1024 << 20}, true},
		{"idle keeps the floor", 0, 100, true, gpuv1alpha1.Share{ComputePercent: 10, MemoryBytes: 1024 << 20}, true},
		// 60 + 20 = 80: heavy.
		{"heavy at 80", 60, 1000, true, gpuv1alpha1.Share{}, false},
		{"unprofiled", nan, 1000, true, gpuv1alpha1.Share{}, false},
		{"no peak memory", 20, nan, true, gpuv1alpha1.Share{}, false},
		{"data without memory sizes compute alone", 20, nan, false, gpuv1alpha1.Share{ComputePercent: 30}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := SizeShare(tc.util, tc.peakMiB, tc.memKnown)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func handMadeGPU(t *testing.T) *PackingData {
	t.Helper()
	d, err := readHandMade(t).ForGPU("t1", 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestPackingOnTheHandMadePairs(t *testing.T) {
	d := handMadeGPU(t)
	run := func(p PackPolicy) PackResult {
		return d.Simulate(PackRun{Policy: p, Load: 0.7, Seed: 1, GPUs: 8, Jobs: 600})
	}
	whole, prism, random, oracle := run(PackWhole), run(PackPrism), run(PackRandom), run(PackOracle)
	if whole.Goodput != 1 || whole.Below80 != 0 || whole.Paired != 0 {
		t.Errorf("whole-gpu: goodput %v, below 80 %% %v, paired %v; want 1, 0, 0", whole.Goodput, whole.Below80, whole.Paired)
	}
	// Prism pairs light with light or medium (30 + 30, 30 + 65 ≤ 100), never
	// medium with medium (130) or anything with heavy (whole GPU): every
	// pair it makes keeps both at 85 % or more.
	if prism.Below80 != 0 || prism.Paired == 0 || prism.Goodput <= 1 {
		t.Errorf("prism: below 80 %% %v, paired %v, goodput %v; want 0, > 0, > 1", prism.Below80, prism.Paired, prism.Goodput)
	}
	// Random pairing also puts heavy with heavy (out of memory) and medium
	// with heavy (0.5).
	if random.Below80 == 0 || random.OOMs == 0 {
		t.Errorf("random-pair: below 80 %% %v, OOMs %v; want both above 0", random.Below80, random.OOMs)
	}
	if oracle.Below80 != 0 || oracle.Goodput < prism.Goodput {
		t.Errorf("oracle: below 80 %% %v, goodput %v; want 0 and at least prism's %v", oracle.Below80, oracle.Goodput, prism.Goodput)
	}
}

// Prism reads jobs.csv only: when the judge rates every pair badly, prism
// still pairs what its profiles say fits, and its jobs pay for it; the
// oracle, which reads the table, stops pairing.
func TestPrismDoesNotSeeTheJudgesTable(t *testing.T) {
	d := handMadeGPU(t)
	for i := range d.speed {
		for k := range d.speed[i] {
			if d.speed[i][k] > 0 {
				d.speed[i][k] = 0.5
			}
		}
	}
	prism := d.Simulate(PackRun{Policy: PackPrism, Load: 0.7, Noise: 0.2, Seed: 3, GPUs: 8, Jobs: 600})
	if prism.Paired == 0 || prism.Below80 == 0 {
		t.Errorf("prism: paired %v, below 80 %% %v; want both above 0", prism.Paired, prism.Below80)
	}
	oracle := d.Simulate(PackRun{Policy: PackOracle, Load: 0.7, Seed: 3, GPUs: 8, Jobs: 600})
	if oracle.Paired != 0 || oracle.Below80 != 0 {
		t.Errorf("oracle: paired %v, below 80 %% %v; want 0, 0", oracle.Paired, oracle.Below80)
	}
}

// Every pair of a GPU model's job types must be judged: by default a
// missing one is refused, and the error names it; with
// --skip-incomplete, job types are left out until none is missing, the one
// lacking the most pairs first, the later in the jobs file on a tie.
func TestForGPUWantsEveryPairJudged(t *testing.T) {
	const hint = "(--skip-incomplete leaves out job types until none is missing)"
	type result struct {
		Jobs    []string
		Dropped []DroppedJob
		Err     string
	}
	for _, tc := range []struct {
		name string
		// without are the pairs left out of the hand-made table, by index:
		// light+light, light+medium, light+heavy, medium+medium,
		// medium+heavy, heavy+heavy.
		without      []int
		refuse, skip result
	}{{
		name:   "complete",
		refuse: result{Jobs: []string{"light", "medium", "heavy"}},
		skip:   result{Jobs: []string{"light", "medium", "heavy"}},
	}, {
		name:    "a self-pair missing",
		without: []int{5},
		refuse:  result{Err: `gpu "t1": the pair table lacks 1 of the 6 pairs of its job types ` + hint + `: heavy + heavy`},
		skip:    result{Jobs: []string{"light", "medium"}, Dropped: []DroppedJob{{Job: "heavy", Lacks: []string{"heavy + heavy"}}}},
	}, {
		name:    "the job type lacking the most goes first",
		without: []int{1, 3},
		refuse:  result{Err: `gpu "t1": the pair table lacks 2 of the 6 pairs of its job types ` + hint + `: light + medium; medium + medium`},
		skip:    result{Jobs: []string{"light", "heavy"}, Dropped: []DroppedJob{{Job: "medium", Lacks: []string{"light + medium", "medium + medium"}}}},
	}, {
		name:    "on a tie the later one goes",
		without: []int{2},
		refuse:  result{Err: `gpu "t1": the pair table lacks 1 of the 6 pairs of its job types ` + hint + `: light + heavy`},
		skip:    result{Jobs: []string{"light", "medium"}, Dropped: []DroppedJob{{Job: "heavy", Lacks: []string{"light + heavy"}}}},
	}, {
		name:    "every pair but one self-pair missing",
		without: []int{1, 2, 3, 4, 5},
		refuse: result{Err: `gpu "t1": the pair table lacks 5 of the 6 pairs of its job types ` + hint +
			`: light + medium; light + heavy; medium + medium; medium + heavy; heavy + heavy`},
		skip: result{Jobs: []string{"light"}, Dropped: []DroppedJob{
			{Job: "heavy", Lacks: []string{"light + heavy", "medium + heavy", "heavy + heavy"}},
			{Job: "medium", Lacks: []string{"light + medium", "medium + medium"}},
		}},
	}, {
		name:    "no pair on the gpu",
		without: []int{0, 1, 2, 3, 4, 5},
		refuse:  result{Err: `gpu "t1": the pair table has no pair on this gpu`},
		skip:    result{Err: `gpu "t1": the pair table has no pair on this gpu`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := readHandMade(t)
			var pairs []PairSpeed
			for i, p := range m.Pairs {
				if !slices.Contains(tc.without, i) {
					pairs = append(pairs, p)
				}
			}
			m.Pairs = pairs
			for _, mode := range []struct {
				name   string
				forGPU func(string, float64) (*PackingData, error)
				want   result
			}{{"refusing", m.ForGPU, tc.refuse}, {"skipping", m.ForGPUSkipIncomplete, tc.skip}} {
				var got result
				d, err := mode.forGPU("t1", 16<<10)
				if err != nil {
					got.Err = err.Error()
				} else {
					for _, j := range d.Jobs {
						got.Jobs = append(got.Jobs, j.Job)
					}
					got.Dropped = d.Dropped
					// What is left is judged in full.
					for i := range d.speed {
						for k := range d.speed[i] {
							if math.IsNaN(d.speed[i][k]) {
								t.Errorf("%s: %s beside %s is not judged", mode.name, d.Jobs[i].Job, d.Jobs[k].Job)
							}
						}
					}
				}
				if diff := cmp.Diff(mode.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", mode.name, diff)
				}
			}
		})
	}
	m := readHandMade(t)
	if _, err := m.ForGPU("nope", 1); err == nil || !strings.Contains(err.Error(), "gpus: t1, t2") {
		t.Errorf("error %v, want the GPUs listed", err)
	}
}

// The refusal counts the missing pairs and names the first
// MissingPairsNamed of them; a pair whose speeds are empty was not
// measured, so it is missing too.
func TestTheRefusalNamesTheFirstMissingPairsAndCounts(t *testing.T) {
	const hint = "(--skip-incomplete leaves out job types until none is missing)"
	// Four job types, j0 to j3: ten pairs, in the order the error names
	// them.
	var jobs []MeasuredJob
	for i := range 4 {
		jobs = append(jobs, MeasuredJob{Job: fmt.Sprintf("j%d", i), GPU: "t1", Throughput: 1, UtilPct: 50, MemMiB: 1000})
	}
	var all []PairSpeed
	for i := range jobs {
		for _, k := range jobs[i:] {
			all = append(all, PairSpeed{JobA: jobs[i].Job, JobB: k.Job, GPU: "t1", SpeedA: 0.9, SpeedB: 0.9})
		}
	}
	for _, tc := range []struct {
		name string
		// without are the pairs left out, by index into all; empty are
		// those kept with empty speeds.
		without, empty []int
		want           string
	}{{
		name:    "as many as it names",
		without: []int{0, 1, 2, 3, 4},
		want:    `gpu "t1": the pair table lacks 5 of the 10 pairs of its job types ` + hint + `: j0 + j0; j0 + j1; j0 + j2; j0 + j3; j1 + j1`,
	}, {
		name:    "one more than it names",
		without: []int{0, 1, 2, 3, 4, 9},
		want:    `gpu "t1": the pair table lacks 6 of the 10 pairs of its job types ` + hint + `: j0 + j0; j0 + j1; j0 + j2; j0 + j3; j1 + j1; and 1 more`,
	}, {
		name:    "all but one",
		without: []int{1, 2, 3, 4, 5, 6, 7, 8, 9},
		want:    `gpu "t1": the pair table lacks 9 of the 10 pairs of its job types ` + hint + `: j0 + j1; j0 + j2; j0 + j3; j1 + j1; j1 + j2; and 4 more`,
	}, {
		name:  "empty speeds",
		empty: []int{7},
		want:  `gpu "t1": the pair table lacks 1 of the 10 pairs of its job types ` + hint + `: j2 + j2`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			m := &Measured{Jobs: jobs}
			for i, p := range all {
				switch {
				case slices.Contains(tc.without, i):
					continue
				case slices.Contains(tc.empty, i):
					p.SpeedA, p.SpeedB = math.NaN(), math.NaN()
				}
				m.Pairs = append(m.Pairs, p)
			}
			var got string
			if _, err := m.ForGPU("t1", 16<<10); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

// The report names the job types left out and the speeds read as 1.
func TestPackingReportNamesWhatWasLeftOutOrReadAsOne(t *testing.T) {
	m := readHandMade(t)
	m.Pairs = m.Pairs[:5] // no heavy + heavy
	m.Pairs[1].SpeedA, m.Pairs[1].Clamped = 1, []string{"pairs.csv:4: speed_a 1.004"}
	d, err := m.ForGPUSkipIncomplete("t1", 16<<10)
	if err != nil {
		t.Fatal(err)
	}
	s := PackSweep{Policies: []PackPolicy{PackWhole, PackPrism}, Loads: []float64{0.5}, Noises: []float64{0}, Seeds: 1, GPUs: 4, Jobs: 100, Workers: 1}
	outs, err := d.Execute(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WritePackingReport(&b, d, s, SummarisePacking(outs)); err != nil {
		t.Fatal(err)
	}
	got := strings.Split(b.String(), "\n")[:3]
	want := []string{
		"Packing on t1: 2 job types (2 with a utilisation figure, 0 of those heavy at no noise; the rest keep a whole GPU under prism), 3 pairs judged.",
		"Left out (--skip-incomplete), as the pair table lacks a pair of them: heavy (lacks 1 pair: heavy + heavy).",
		"Read as 1, as measurement noise (a job runs no faster beside another than alone, nor on a slice than on the whole GPU; up to 1% above 1 is taken as noise): 1 speed, pairs.csv:4: speed_a 1.004.",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
}

// The verdict's figures are printed so that they never contradict it: a
// ratio or share that two (one) decimals would round across its goal gets
// the decimals it takes.
func TestPackingVerdictPrintsFiguresThatAgreeWithIt(t *testing.T) {
	row := func(p PackPolicy, noise, goodput, below80 float64) *PackRow {
		return &PackRow{Policy: p, Load: 0.5, Noise: noise, Goodput: Estimate{Mean: goodput, N: 3}, Below80: Estimate{Mean: below80, N: 3}}
	}
	for _, tc := range []struct {
		name                  string
		prism, prism20, whole float64
		below80               float64
		want                  string
	}{{
		name:  "just below the goal",
		prism: 1.299, prism20: 1.1, whole: 1, below80: 0.01,
		want: "load 50%: prism at 0% noise goodput 1.30, <80% 1.0% (target met); vs best profile-free meeting it (whole-gpu 1.00): 1.299x (goal >= 1.30x: fails); vs whole-gpu: 1.30x (goal >= 1.5x: fails);" +
			" prism at 20% noise goodput 1.10, <80% 1.0% (target met); vs best profile-free meeting it (whole-gpu 1.00): 1.10x (goal >= 1.15x: fails);",
	}, {
		name:  "at the goal",
		prism: 1.3, prism20: 1.1499999, whole: 1, below80: 0.01,
		want: "load 50%: prism at 0% noise goodput 1.30, <80% 1.0% (target met); vs best profile-free meeting it (whole-gpu 1.00): 1.30x (goal >= 1.30x: holds); vs whole-gpu: 1.30x (goal >= 1.5x: fails);" +
			" prism at 20% noise goodput 1.15, <80% 1.0% (target met); vs best profile-free meeting it (whole-gpu 1.00): 1.1499999x (goal >= 1.15x: fails);",
	}, {
		name:  "just above the interference target",
		prism: 1.6, prism20: 1.6, whole: 1, below80: 0.0504,
		want: "load 50%: prism at 0% noise goodput 1.60, <80% 5.04% (target missed); vs best profile-free meeting it (whole-gpu 1.00): 1.60x (goal >= 1.30x: fails); vs whole-gpu: 1.60x (goal >= 1.5x: fails);" +
			" prism at 20% noise goodput 1.60, <80% 5.04% (target missed); vs best profile-free meeting it (whole-gpu 1.00): 1.60x (goal >= 1.15x: fails);",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rows := []*PackRow{row(PackWhole, 0, tc.whole, 0), row(PackPrism, 0, tc.prism, tc.below80), row(PackPrism, 0.2, tc.prism20, tc.below80)}
			if diff := cmp.Diff([]string{tc.want}, PackingVerdict(rows)); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPackingVerdictComparesWithTheBestProfileFreePolicyMeetingTheTarget(t *testing.T) {
	d := handMadeGPU(t)
	s := PackSweep{Policies: PackPolicies, Loads: []float64{0.5}, Noises: []float64{0, 0.2}, Seeds: 3, GPUs: 8, Jobs: 400, Workers: 2, WithGPUsNeeded: true}
	outs, err := d.Execute(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	if len(outs) != 3*6 {
		t.Fatalf("%d runs, want 18 (whole, memory, random, oracle, prism at two noise levels; three seeds)", len(outs))
	}
	rows := SummarisePacking(outs)
	var b strings.Builder
	if err := WritePackingReport(&b, d, s, rows); err != nil {
		t.Fatal(err)
	}
	got := b.String()
	for _, want := range []string{
		"Packing on t1: 3 job types (3 with a utilisation figure, 1 of those heavy",
		"Memory: measured per job type; 16384 MiB per GPU.",
		"vs best profile-free meeting it (whole-gpu 1.00)",
		"prism at 20% noise",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
}
