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
	"math/bits"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

const slicing = "testdata/slicing/"

func readSlicing(t *testing.T, slicesFile string) *SlicingData {
	t.Helper()
	m, err := ReadMeasured(slicing+"jobs.csv", "", slicing+slicesFile)
	if err != nil {
		t.Fatal(err)
	}
	d, err := m.ForSlicing("a100-40gb")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// choices names the profile each policy asks for, per job type, with the
// measured figures scaled by factor.
func choices(d *SlicingData, factor float64) map[SlicePolicy][]string {
	out := map[SlicePolicy][]string{}
	for _, p := range SlicePolicies {
		for i := range d.Jobs {
			out[p] = append(out[p], d.Model.Profiles[d.Choose(p, i, factor)].Name)
		}
	}
	return out
}

func TestSliceChoicesFollowEachPolicysRule(t *testing.T) {
	d := readSlicing(t, "slices.csv")
	// Job types in file order: light, medium, heavy, fat.
	want := map[SlicePolicy][]string{
		SliceWhole: {"7g.40gb", "7g.40gb", "7g.40gb", "7g.40gb"},
		// 2000, 6000, 12000 and 4000 MiB: nothing else is read.
		SliceMemory: {"1g.5gb", "2g.10gb", "3g.20gb", "1g.5gb"},
		// light 15 % → 25 % compute (2g's 28 of 108 SMs are 25.9 %),
		// 3 GiB; medium 40 % → 55 % (more than 4g's 56 SMs, 51.9 %, and
		// the whole GPU is never a partition): kept whole; heavy kept
		// whole; fat 10 % → 20 %, 4000 × 1.2 + 512 → 6 GiB, more than
		// 1g.5gb holds.
		SlicePrism: {"2g.10gb", "7g.40gb", "7g.40gb", "2g.10gb"},
		// The first slice at 80 % or more of the whole GPU.
		SliceOracle: {"1g.5gb", "3g.20gb", "7g.40gb", "3g.20gb"},
	}
	if diff := cmp.Diff(want, choices(d, 1)); diff != "" {
		t.Errorf("choices (-want +got):\n%s", diff)
	}
}

// Only the oracle reads slices.csv: with every slice made slow, the other
// policies choose exactly as before, at every noise factor, and the
// oracle keeps everything whole.
func TestOnlyTheOracleReadsTheSliceSpeeds(t *testing.T) {
	good, slow := readSlicing(t, "slices.csv"), readSlicing(t, "slices-slow.csv")
	for _, factor := range []float64{0.6, 0.9, 1, 1.2, 1.4} {
		g, s := choices(good, factor), choices(slow, factor)
		for _, p := range []SlicePolicy{SliceWhole, SliceMemory, SlicePrism} {
			if diff := cmp.Diff(g[p], s[p]); diff != "" {
				t.Errorf("%s at factor %g changed with the judge's table (-good +slow):\n%s", p, factor, diff)
			}
		}
		if diff := cmp.Diff([]string{"7g.40gb", "7g.40gb", "7g.40gb", "7g.40gb"}, s[SliceOracle]); diff != "" {
			t.Errorf("oracle on the slow table (-want +got):\n%s", diff)
		}
		if cmp.Equal(g[SliceOracle], s[SliceOracle]) {
			t.Errorf("oracle chose the same on both tables: %v", g[SliceOracle])
		}
	}
}

func TestForSlicingRejectsWhatItCannotModel(t *testing.T) {
	m, err := ReadMeasured(slicing+"jobs.csv", "", slicing+"slices-unknown-profile.csv")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ gpu, want string }{
		{"a100-40gb", `slices file line 3: slice "1g.10gb" is not a MIG profile of a100-40gb`},
		{"h100-80gb", `no MIG model for gpu "h100-80gb" (models: a100-40gb)`},
	} {
		if _, err := m.ForSlicing(tc.gpu); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ForSlicing(%s) = %v, want an error with %q", tc.gpu, err, tc.want)
		}
	}
}

// Placements are NVML's: instances fit together only where their memory
// slices do not overlap, which also keeps compute within seven slices.
func TestPlacementsFollowTheA100Geometry(t *testing.T) {
	m := MIGModels["a100-40gb"]
	prof := map[string]MIGProfile{}
	for _, p := range m.Profiles {
		prof[p.Name] = p
	}
	for _, tc := range []struct {
		name  string
		order []string
		// want is each instance's start, -1 where it did not fit.
		want []int
	}{
		{"seven 1g, no eighth", []string{"1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb", "1g.5gb"}, []int{6, 5, 4, 3, 2, 1, 0, -1}},
		{"4g and 3g", []string{"4g.20gb", "3g.20gb", "1g.5gb"}, []int{0, 4, -1}},
		{"two 3g and nothing more", []string{"3g.20gb", "3g.20gb", "1g.5gb"}, []int{4, 0, -1}},
		{"a 1g keeps slice 0 free for a 4g", []string{"1g.5gb", "4g.20gb", "3g.20gb", "2g.10gb"}, []int{6, 0, -1, 4}},
		{"three 2g and a 1g", []string{"2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb", "1g.5gb"}, []int{4, 2, 0, 6, -1}},
		{"the whole GPU takes everything", []string{"7g.40gb", "1g.5gb"}, []int{0, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			used := []uint8{0}
			var got []int
			compute := 0
			for _, name := range tc.order {
				g, at := placeSlice(used, prof[name])
				got = append(got, at)
				if g >= 0 {
					used[g] |= placementMask(prof[name], at)
					compute += prof[name].Compute
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("starts (-want +got):\n%s", diff)
			}
			if compute > m.ComputeSlices || bits.OnesCount8(used[0]) > m.MemorySlices {
				t.Errorf("%d compute slices and memory %08b placed", compute, used[0])
			}
		})
	}
}

func TestPlacementPrefersTheFullestGPU(t *testing.T) {
	one := MIGModels["a100-40gb"].Profiles[0]
	// GPU 1 holds a 2g at 4: the next 1g goes there, at 6.
	g, at := placeSlice([]uint8{0, 0b00110000, 0}, one)
	if g != 1 || at != 6 {
		t.Errorf("placed at gpu %d start %d, want gpu 1 start 6", g, at)
	}
}

func TestSlicingSimulationJudgesBySliceSpeeds(t *testing.T) {
	good, slow := readSlicing(t, "slices.csv"), readSlicing(t, "slices-slow.csv")
	run := SliceRun{Load: 0.05, GPUs: 16, Jobs: 400, Seed: 1}
	at := func(d *SlicingData, p SlicePolicy) SliceResult {
		r := run
		r.Policy = p
		return d.Simulate(r)
	}
	whole := at(good, SliceWhole)
	if math.Abs(whole.Median-1) > 1e-9 || whole.Below80 != 0 || whole.Sevenths != 7 {
		t.Errorf("whole-gpu at 5%% load: median %g, below 80 %g, sevenths %g; want 1, 0, 7", whole.Median, whole.Below80, whole.Sevenths)
	}
	// On the slow table every by-memory job runs on a slice at 0.05 or ran
	// out of memory: all below 80 %, median 20×.
	mem := at(slow, SliceMemory)
	if mem.Below80 != 1 || mem.Median < 19.9 || mem.Median > 20.1 {
		t.Errorf("by-memory on the slow table: below 80 %g, median %g; want 1 and 20", mem.Below80, mem.Median)
	}
	// fat asks for 1g.5gb, which slices.csv lacks: a quarter of starts fail.
	if o := at(good, SliceMemory).OOMs; o < 150 || o > 350 {
		t.Errorf("by-memory OOMs per 1000 = %g, want about 250 (one job type in four)", o)
	}
	if o := at(good, SlicePrism).OOMs; o != 0 {
		t.Errorf("prism OOMs per 1000 = %g, want 0 (its margin keeps fat off 1g.5gb)", o)
	}
	oracle := at(good, SliceOracle)
	if oracle.Below80 != 0 || oracle.Goodput <= whole.Goodput {
		t.Errorf("oracle: below 80 %g, goodput %g (whole-gpu %g); want 0 and more than whole-gpu", oracle.Below80, oracle.Goodput, whole.Goodput)
	}
}

func TestSlicingSweepReports(t *testing.T) {
	d := readSlicing(t, "slices.csv")
	s := SliceSweep{Policies: SlicePolicies, Loads: []float64{0.5, 0.9}, Noises: []float64{0, 0.2}, Seeds: 3, GPUs: 8, Jobs: 300, Workers: 2, WithGPUsNeeded: true}
	outs, err := d.Execute(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	// whole-gpu and oracle once, by-memory and prism twice, per load.
	if got, want := len(outs), 2*6*3; got != want {
		t.Fatalf("%d runs, want %d", got, want)
	}
	rows := SummariseSlicing(outs)
	if len(rows) != 12 {
		t.Fatalf("%d rows, want 12", len(rows))
	}
	for _, r := range rows {
		if r.Policy == SliceOracle {
			whole := rows[slicesIndex(rows, SliceWhole, r.Load)]
			if r.GPUsNeeded.N == 0 || r.GPUsNeeded.Mean > whole.GPUsNeeded.Mean {
				t.Errorf("load %g: oracle needs %v GPUs, whole-gpu %v; want no more", r.Load, r.GPUsNeeded, whole.GPUsNeeded)
			}
		}
	}
	var b strings.Builder
	if err := WriteSlicingReport(&b, d, s, rows); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"MIG sizing on a100-40gb: 4 job types", "fat", "oom", "load 90%: median slowdown whole-gpu"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	for _, m := range SliceMetrics {
		var svg strings.Builder
		if err := WriteSlicingSVG(&svg, "t", rows, m); err != nil || !strings.Contains(svg.String(), "prism, 20% noise") {
			t.Errorf("%s plot: %v, lacks the prism line", m.Name, err)
		}
	}
}

func slicesIndex(rows []*SliceRow, p SlicePolicy, load float64) int {
	for i, r := range rows {
		if r.Policy == p && r.Load == load {
			return i
		}
	}
	return -1
}

// A slice with no row or an empty speed was not measured: no policy
// chooses it (a rule that picks it moves up to the next slice the job was
// measured on), and it is never taken as a job that did not fit. fat's
// 1g.5gb is "did not fit" (0) in slices.csv, has no row in
// slices-unmeasured.csv and an empty speed in slices-empty-speed.csv.
func TestAnUnmeasuredSliceIsNotChosenNorAFitFailure(t *testing.T) {
	for _, tc := range []struct {
		file string
		// want is what each policy asks for fat (job type 3).
		want map[SlicePolicy]string
		// ooms is by-memory's out-of-memory starts per 1000 jobs, about
		// one job type in four where fat's 1g.5gb did not fit.
		oomsLo, oomsHi float64
	}{
		{"slices.csv", map[SlicePolicy]string{SliceWhole: "7g.40gb", SliceMemory: "1g.5gb", SlicePrism: "2g.10gb", SliceOracle: "3g.20gb"}, 150, 350},
		{"slices-unmeasured.csv", map[SlicePolicy]string{SliceWhole: "7g.40gb", SliceMemory: "2g.10gb", SlicePrism: "2g.10gb", SliceOracle: "3g.20gb"}, 0, 0},
		{"slices-empty-speed.csv", map[SlicePolicy]string{SliceWhole: "7g.40gb", SliceMemory: "2g.10gb", SlicePrism: "2g.10gb", SliceOracle: "3g.20gb"}, 0, 0},
	} {
		t.Run(tc.file, func(t *testing.T) {
			d := readSlicing(t, tc.file)
			got := map[SlicePolicy]string{}
			for p, names := range choices(d, 1) {
				got[p] = names[3]
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("fat's choices (-want +got):\n%s", diff)
			}
			r := d.Simulate(SliceRun{Policy: SliceMemory, Load: 0.05, GPUs: 16, Jobs: 400, Seed: 1})
			if r.OOMs < tc.oomsLo || r.OOMs > tc.oomsHi {
				t.Errorf("by-memory OOMs per 1000 = %g, want within [%g, %g]", r.OOMs, tc.oomsLo, tc.oomsHi)
			}
		})
	}
}

// The report counts and names the slices not measured and the choices
// moved past them.
func TestSlicingReportNamesTheUnmeasuredSlices(t *testing.T) {
	for _, tc := range []struct {
		name       string
		unmeasured [][]string
		want       []string
	}{{
		name:       "one",
		unmeasured: [][]string{nil, nil, nil, {"1g.5gb"}},
		want: []string{
			"Not measured: 1 slice of 1 job type (no row or an empty speed in the slices file; no policy chooses one, a job whose rule picks one gets the next larger slice it was measured on): fat on 1g.5gb.",
			"fat 10.0 4000 2g.10gb (1g.5gb not measured) 2g.10gb 3g.20gb 0.70 0.70",
		},
	}, {
		name:       "three of two job types",
		unmeasured: [][]string{{"1g.5gb", "2g.10gb"}, nil, nil, {"1g.5gb"}},
		want: []string{
			"Not measured: 3 slices of 2 job types (no row or an empty speed in the slices file; no policy chooses one, a job whose rule picks one gets the next larger slice it was measured on): light on 1g.5gb, 2g.10gb; fat on 1g.5gb.",
			"fat 10.0 4000 2g.10gb (1g.5gb not measured) 2g.10gb 3g.20gb 0.70 0.70",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			d := readSlicing(t, "slices-unmeasured.csv")
			// Take the case's slices out of the table, as if they had no row.
			for i, profiles := range tc.unmeasured {
				for _, p := range profiles {
					d.speed[i][slices.IndexFunc(d.Model.Profiles, func(m MIGProfile) bool { return m.Name == p })] = math.NaN()
				}
			}
			if diff := cmp.Diff(tc.unmeasured, d.Unmeasured()); diff != "" {
				t.Errorf("unmeasured (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, slicingReportLines(t, d, "Not measured", "fat ")); diff != "" {
				t.Errorf("report (-want +got):\n%s", diff)
			}
		})
	}
}

// slicingReportLines runs a small sweep on d and returns the lines of its
// report that start with one of prefixes, runs of spaces made one.
func slicingReportLines(t *testing.T, d *SlicingData, prefixes ...string) []string {
	t.Helper()
	s := SliceSweep{Policies: []SlicePolicy{SliceWhole}, Loads: []float64{0.5}, Seeds: 1, GPUs: 4, Jobs: 100, Workers: 1}
	outs, err := d.Execute(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	if err := WriteSlicingReport(&b, d, s, SummariseSlicing(outs)); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(b.String(), "\n") {
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) {
				got = append(got, strings.Join(strings.Fields(l), " "))
			}
		}
	}
	return got
}

// The GPUs-needed comparison says "the same number" for equal counts and
// never prints 0 % more or fewer.
func TestSlicingVerdictComparesGPUsNeeded(t *testing.T) {
	row := func(p SlicePolicy, need float64) *SliceRow {
		return &SliceRow{Policy: p, Load: 0.5, Median: Estimate{Mean: 1, N: 3}, GPUsNeeded: Estimate{Mean: need, N: 3}}
	}
	for _, tc := range []struct {
		name                         string
		whole, memory, prism, oracle float64
		want                         string
	}{{
		name:  "equal",
		whole: 20, memory: 25, prism: 20, oracle: 16,
		want: "load 50%: median slowdown whole-gpu 1.00x, by-memory 1.00x, prism 1.00x, oracle 1.00x," +
			" prism needs the same number of GPUs as whole-gpu; oracle needs 20% fewer GPUs than whole-gpu; by-memory needs 25% more GPUs than whole-gpu;",
	}, {
		name:  "less than half a per cent apart",
		whole: 20, memory: 20.04, prism: 19.98, oracle: 19.999,
		want: "load 50%: median slowdown whole-gpu 1.00x, by-memory 1.00x, prism 1.00x, oracle 1.00x," +
			" prism needs 0.1% fewer GPUs than whole-gpu; oracle needs 0.01% fewer GPUs than whole-gpu; by-memory needs 0.2% more GPUs than whole-gpu;",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rows := []*SliceRow{row(SliceWhole, tc.whole), row(SliceMemory, tc.memory), row(SlicePrism, tc.prism), row(SliceOracle, tc.oracle)}
			if diff := cmp.Diff([]string{tc.want}, SlicingVerdict(rows)); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

// productionFleet is what prism-controller's fleet view makes of an
// A100-SXM4-40GB node as the kubelet plugin publishes it (the simulated
// NVML's answers, discovered and laid out by the plugin's code), with the
// partitions of the profiles the evaluation models only: the cluster the
// evaluation stands for publishes those (the plugin's MIG profile list).
func productionFleet(t *testing.T, profiles []MIGProfile) *rewrite.Fleet {
	t.Helper()
	modelled := func(d resourceapi.Device) bool {
		a, ok := d.Attributes[gpuv1alpha1.MIGProfileAttribute.Qualified()]
		return !ok || slices.ContainsFunc(profiles, func(p MIGProfile) bool { return p.Name == ptr.Deref(a.StringValue, "") })
	}
	v := fleet.NewView()
	for _, s := range explaintest.MIGSlices(t) {
		s.Spec.Devices = slices.DeleteFunc(s.Spec.Devices, func(d resourceapi.Device) bool { return !modelled(d) })
		v.OnAdd(&s, false)
	}
	f := v.Fleet()
	if len(f.Partitions) != len(profiles) {
		t.Fatalf("the published fleet has partitions %+v, want one per modelled profile", f.Partitions)
	}
	return f
}

// The evaluation's prism policy asks for the partition prism-controller
// would give the same share on the same GPU model, at every compute share
// and at every memory around the profiles' sizes: a rule of its own
// (compute slices out of 7, where production counts SMs out of the
// parent's 108, and never takes the whole GPU as a partition) would judge
// a rule that does not ship.
func TestSlicingChoosesWhatProductionChooses(t *testing.T) {
	d := readSlicing(t, "slices.csv")
	prod := productionFleet(t, d.Model.Profiles)
	memories := []int64{0}
	for gib := int64(1); gib <= 41; gib++ {
		memories = append(memories, gib<<30)
	}
	for _, p := range d.Model.Profiles {
		memories = append(memories, p.MemMiB<<20, p.MemMiB<<20+1)
	}
	want, got := map[string]string{}, map[string]string{}
	for compute := int64(0); compute <= 100; compute++ {
		for _, memory := range memories {
			share := fmt.Sprintf("%d%% compute, %s", compute, resource.NewQuantity(memory, resource.BinarySI))
			want[share] = d.Model.Profiles[d.whole()].Name
			if names, _ := prod.SmallestPartitions(compute, memory); len(names) > 0 {
				want[share] = names[0]
			}
			got[share] = d.Model.Profiles[d.smallest(compute, memory)].Name
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		differ := 0
		for share, p := range want {
			if got[share] != p {
				differ++
			}
		}
		t.Errorf("profile chosen for %d of %d shares differs, production (-) against the evaluation (+):\n%s", differ, len(want), diff)
	}
}

// TestSlicesAreSizedByWhatAJobKeepsBusy: the evaluation sizes a partition
// with production's rule, SM activity first where the data has it, the
// duty cycle where not.
func TestSlicesAreSizedByWhatAJobKeepsBusy(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		name    string
		job     MeasuredJob
		verdict rewrite.PartitionVerdict
		compute int64
	}{
		// 5 + 10 = 15 %, whatever its 90 % duty cycle.
		{"busy small-batch inference", MeasuredJob{UtilPct: 90, SMPct: 5, DRAMPct: 2, MemMiB: 3000}, rewrite.PartitionSized, 15},
		// 90 + 30 = 120 -> 100 %.
		{"the same without SM activity", MeasuredJob{UtilPct: 90, SMPct: nan, DRAMPct: 2, MemMiB: 3000}, rewrite.PartitionHeavy, 100},
		// MISO's DRAM figure, the memory controller's duty cycle, is not
		// read without SM activity: 20 + 10 = 30 %.
		{"DRAM without SM activity", MeasuredJob{UtilPct: 20, SMPct: nan, DRAMPct: 70, MemMiB: 3000}, rewrite.PartitionSized, 30},
		{"no utilisation", MeasuredJob{UtilPct: nan, SMPct: 5, DRAMPct: 2, MemMiB: 3000}, rewrite.PartitionNoUsage, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := sizePartition(tc.job, 1)
			if got.Verdict != tc.verdict || got.ComputePercent != tc.compute {
				t.Errorf("sizePartition = %v %d%% (%s), want %v %d%%", got.Verdict, got.ComputePercent, got.Reason, tc.verdict, tc.compute)
			}
		})
	}
}
