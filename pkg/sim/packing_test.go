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
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func TestSizeShareFollowsTheAgreedRule(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name          string
		util, peakMiB float64
		memKnown      bool
		want          Share
		ok            bool
	}{
		// 20 + max(10, 5) = 30; 2000 × 1.2 + 512 = 2912 → 3 GiB.
		{"light", 20, 2000, true, Share{30, 3072}, true},
		// 50 + 12.5 = 62.5 → 65; 6000 × 1.2 + 512 = 7712 → 8 GiB.
		{"medium", 50, 6000, true, Share{65, 8192}, true},
		// 4 + 10 = 14 → 15; 100 MiB → 632 → floor 1 GiB.
		{"tiny", 4, 100, true, Share{15, 1024}, true},
		{"idle keeps the floor", 0, 100, true, Share{10, 1024}, true},
		// 63 + 15.75 = 78.75 → 80: heavy.
		{"heavy at 80", 63, 1000, true, Share{}, false},
		{"unprofiled", nan, 1000, true, Share{}, false},
		{"no peak memory", 20, nan, true, Share{}, false},
		{"data without memory sizes compute alone", 20, nan, false, Share{30, nan}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := SizeShare(tc.util, tc.peakMiB, tc.memKnown)
			if ok != tc.ok {
				t.Fatalf("ok = %v, want %v", ok, tc.ok)
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateNaNs()); diff != "" {
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

func TestForGPUWantsEveryPairJudged(t *testing.T) {
	m := readHandMade(t)
	m.Pairs = m.Pairs[:5]
	_, err := m.ForGPU("t1", 16<<10)
	if want := `gpu "t1": the pair table lacks 1 pairs of its job types, e.g. heavy + heavy`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
	if _, err := m.ForGPU("nope", 1); err == nil || !strings.Contains(err.Error(), "gpus: t1, t2") {
		t.Errorf("error %v, want the GPUs listed", err)
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
