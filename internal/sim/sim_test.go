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
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-6*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.6g, want %.6g", what, got, want)
	}
}

const all = 1<<numModels - 1

// env builds an environment from hand-made machines and pods, replayed
// once, so that every pod is measured.
func env(t *testing.T, machines []Machine, pods ...*Pod) *Env {
	t.Helper()
	for _, p := range pods {
		if p.Milli == 0 {
			p.Milli = 1000
		}
		if p.Allowed == 0 {
			p.Allowed = all
		}
	}
	e, err := NewEnv(context.Background(), machines, pods, 1, shippedJobTypes(t))
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func simulate(t *testing.T, e *Env, r Run) *Result {
	t.Helper()
	if r.Compression == 0 && r.Load == 0 {
		r.Compression = 1
	}
	res, err := e.Simulate(r)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func machine(name string, m ModelID, gpus int) Machine {
	return Machine{Name: name, Model: m, GPUs: gpus, CPU: 64000, Memory: 262144}
}

func TestParseNodesKeepsMeasuredModels(t *testing.T) {
	f, err := os.Open("testdata/nodes.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, st, err := ParseNodes(f)
	if err != nil {
		t.Fatal(err)
	}
	want := []Machine{
		{"node-p100-0", P100, 2, 64000, 262144},
		{"node-p100-1", P100, 2, 64000, 262144},
		{"node-t4-0", K80, 2, 96000, 393216},
		{"node-v100-0", V100, 8, 96000, 786432},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("machines %+v, want %+v", got, want)
	}
	if !reflect.DeepEqual(st.Skipped, map[string]int{"G2": 8}) {
		t.Errorf("skipped %v, want G2: 8", st.Skipped)
	}
}

func TestParsePodsHygiene(t *testing.T) {
	f, err := os.Open("testdata/pods.csv")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	pods, st, err := ParsePods(f, PodOptions{Cap: 100000, WindowQuantile: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	// 11 rows: one CPU-only, one Failed, one Pending, one pinned to G2
	// only; of the 7 left, sorted by creation, the 0.2 quantile is index
	// int(0.2*6) = 1 (created 1400), so pod-early is before the window.
	wantStats := PodStats{Rows: 11, Kept: 6, NoGPU: 1, Failed: 1, NeverScheduled: 1, PinnedElsewhere: 1, BeforeWindow: 1, Censored: 1, Capped: 2, Shared: 1, MultiGPU: 2}
	if st != wantStats {
		t.Errorf("stats %+v, want %+v", st, wantStats)
	}
	var names []string
	for _, p := range pods {
		names = append(names, p.Name)
	}
	if want := "pod-v100 pod-share pod-t4 pod-multi pod-long pod-censored"; strings.Join(names, " ") != want {
		t.Fatalf("pods %v, want %s", names, want)
	}
	byName := map[string]*Pod{}
	for _, p := range pods {
		byName[p.Name] = p
	}
	for _, tc := range []struct {
		name string
		want Pod
	}{
		// Arrivals shift by the window start (1400); runtime is deletion -
		// scheduled.
		{"pod-v100", Pod{ID: 0, Name: "pod-v100", Arrival: 0, GPUs: 1, Milli: 1000, CPU: 16000, Memory: 32768, Allowed: 1 << V100, Pinned: true, Runtime: 280}},
		{"pod-share", Pod{ID: 1, Name: "pod-share", Arrival: 100, GPUs: 1, Milli: 460, CPU: 4000, Memory: 8000, Allowed: all, Runtime: 1000}},
		// G2|T4: only T4 maps into the fleet, as K80.
		{"pod-t4", Pod{ID: 2, Name: "pod-t4", Arrival: 200, GPUs: 1, Milli: 1000, CPU: 4000, Memory: 8000, Allowed: 1 << K80, Pinned: true, Runtime: 290}},
		{"pod-long", Pod{ID: 4, Name: "pod-long", Arrival: 400, GPUs: 1, Milli: 1000, CPU: 4000, Memory: 8000, Allowed: all, Runtime: 100000, Capped: true}},
		// Deleted at the trace's last timestamp: still running then. The
		// cap applies to it too.
		{"pod-censored", Pod{ID: 5, Name: "pod-censored", Arrival: 500, GPUs: 2, Milli: 1000, CPU: 4000, Memory: 8000, Allowed: all, Runtime: 100000, Capped: true, Censored: true}},
	} {
		if got := *byName[tc.name]; got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

func TestParsePodsRejectsListsWithoutTimes(t *testing.T) {
	_, _, err := ParsePods(strings.NewReader("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np,1000,1000,1,1000\n"), PodOptions{})
	// The error names the missing column and the lists a replay can use.
	for _, want := range []string{"creation_time", "multigpu", "openb_pod_list_default.csv"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %q", err, want)
		}
	}
}

func TestQueueingFIFOWithoutHeadOfLineBlocking(t *testing.T) {
	// One V100 node with 2 GPUs, speed 1 (null-speed). Pod 0 holds one
	// GPU 0-100; pod 1 (2 GPUs, 10 s) arrives at 1 and waits until 100;
	// pod 2 (1 GPU, 10 s) arrives at 2 and starts at once on the free GPU.
	e := env(t, []Machine{machine("v", V100, 2)},
		&Pod{Arrival: 0, GPUs: 1, Runtime: 100},
		&Pod{Arrival: 1, GPUs: 2, Runtime: 10},
		&Pod{Arrival: 2, GPUs: 1, Runtime: 10})
	r := simulate(t, e, Run{Policy: Blind, NullSpeed: true})
	// JCTs 100, 109, 10; slowdowns 1, 10.9, 1.
	near(t, "mean JCT", r.MeanJCT, (100+109+10)/3.0)
	near(t, "median slowdown", r.MedianSlowdown, 1)
	near(t, "p99 slowdown", r.P99Slowdown, 10.9)
	near(t, "multi-GPU wait", r.MultiGPUWait, 99)
	near(t, "mean wait", r.MeanWait, 33)
}

func TestCPUAndMemoryFit(t *testing.T) {
	// Two GPUs but CPU for one pod only: the second waits for the first.
	m := machine("v", V100, 2)
	m.CPU = 8000
	e := env(t, []Machine{m},
		&Pod{Arrival: 0, GPUs: 1, CPU: 6000, Runtime: 50},
		&Pod{Arrival: 0, GPUs: 1, CPU: 6000, Runtime: 50})
	r := simulate(t, e, Run{Policy: Blind, NullSpeed: true})
	near(t, "mean JCT", r.MeanJCT, (50+100)/2.0)
	m.CPU, m.Memory = 64000, 1000
	e = env(t, []Machine{m},
		&Pod{Arrival: 0, GPUs: 1, Memory: 600, Runtime: 50},
		&Pod{Arrival: 0, GPUs: 1, Memory: 600, Runtime: 50})
	r = simulate(t, e, Run{Policy: Blind, NullSpeed: true})
	near(t, "mean JCT (memory)", r.MeanJCT, (50+100)/2.0)
}

func TestGPUSharing(t *testing.T) {
	// One GPU: shares of 600 and 400 run together; a share of 300 waits
	// until the 400 ends at 20; a whole-GPU pod waits until every share is
	// gone (the 600 at 100, the 300 at 20+30 = 50).
	e := env(t, []Machine{machine("v", V100, 1)},
		&Pod{Arrival: 0, GPUs: 1, Milli: 600, Runtime: 100},
		&Pod{Arrival: 0, GPUs: 1, Milli: 400, Runtime: 20},
		&Pod{Arrival: 1, GPUs: 1, Milli: 300, Runtime: 30},
		&Pod{Arrival: 2, GPUs: 1, Runtime: 10})
	r := simulate(t, e, Run{Policy: Blind, NullSpeed: true})
	// JCTs: 100, 20, 50-1 = 49, 110-2 = 108.
	near(t, "mean JCT", r.MeanJCT, (100+20+49+108)/4.0)
	near(t, "mean wait", r.MeanWait, (0+0+19+98)/4.0)
}

func TestCensoredPodsHoldResourcesButAreNotCounted(t *testing.T) {
	e := env(t, []Machine{machine("v", V100, 1)},
		&Pod{Arrival: 0, GPUs: 1, Runtime: 1000, Censored: true},
		&Pod{Arrival: 10, GPUs: 1, Runtime: 10})
	r := simulate(t, e, Run{Policy: Blind, NullSpeed: true})
	if r.Pods != 1 {
		t.Errorf("pods in the figures = %d, want 1", r.Pods)
	}
	near(t, "mean JCT", r.MeanJCT, 1000)
}

func TestRuntimeNormalisedByTheGPUThePodRanOn(t *testing.T) {
	// A pod pinned to K80 ran 1000 s on a K80: its V100 runtime is
	// 1000 * speed(K80). Placed on the K80 again it runs 1000 s, so its
	// slowdown is 1/speed(K80).
	e := env(t, []Machine{machine("k", K80, 1), machine("v", V100, 1)}, &Pod{Arrival: 0, GPUs: 1, Runtime: 1000, Allowed: 1 << K80})
	a := e.assign(3, 0)
	ty := e.jobTypes[a.jobType[0]]
	r := simulate(t, e, Run{Policy: Blind, Seed: 3})
	near(t, "slowdown", r.MedianSlowdown, 1/ty.Speed(K80))
	near(t, "mean JCT", r.MeanJCT, 1000)
	// Unpinned, on a fleet of one K80 and one V100: observed runtime is
	// the mean over both, 1000 = w/2 * (1/s + 1), so w = 2000 s/(1/s+1).
	// Fastest-free puts it on the V100: JCT = w.
	e = env(t, []Machine{machine("k", K80, 1), machine("v", V100, 1)}, &Pod{Arrival: 0, GPUs: 1, Runtime: 1000})
	r = simulate(t, e, Run{Policy: FastestFree, Seed: 3})
	near(t, "mean JCT unpinned", r.MeanJCT, 2000/(1/ty.Speed(K80)+1))
	near(t, "slowdown on the reference", r.MedianSlowdown, 1)
}

func TestPolicyLaddersOnTheGavelFleet(t *testing.T) {
	// K80 240 GB/s, P100 732, V100 898 (from the boards' clocks); FP32
	// P100 9525 GFLOPS, V100 15667, K80 none published. Bandwidth:
	// 898/732 = 1.23 < 1.3 is no gap, 732/240 = 3.05 is: classes
	// {V100, P100} | {K80}. FP32: 15667/9525 = 1.64: {V100} | {P100}.
	e := env(t, []Machine{machine("k", K80, 1), machine("p", P100, 1), machine("v", V100, 1)}, &Pod{GPUs: 1, Runtime: 1})
	for _, tc := range []struct {
		policy prismv1alpha1.Policy
		bound  prismv1alpha1.BoundType
		want   tiers
	}{
		{prismv1alpha1.PolicyPerformance, prismv1alpha1.BoundTypeMemoryBound, tiers{K80: 1, P100: 0, V100: 0}},
		// The K80, which publishes no FP32 figure, comes after every model
		// that does.
		{prismv1alpha1.PolicyPerformance, prismv1alpha1.BoundTypeComputeBound, tiers{K80: 2, P100: 1, V100: 0}},
		// Latency-bound ranks by FP32 as compute-bound does.
		{prismv1alpha1.PolicyPerformance, prismv1alpha1.BoundTypeLatencyBound, tiers{K80: 2, P100: 1, V100: 0}},
		{prismv1alpha1.PolicyPerformance, prismv1alpha1.BoundTypeBalanced, tiers{}},
		{prismv1alpha1.PolicyEconomy, prismv1alpha1.BoundTypeMemoryBound, tiers{K80: 1, P100: 0, V100: 0}},
		{prismv1alpha1.PolicyEconomy, prismv1alpha1.BoundTypeLatencyBound, tiers{K80: 0, P100: 1, V100: 1}},
	} {
		if got := e.prism[tc.policy][tc.bound]; got != tc.want {
			t.Errorf("%s %s: tiers %v, want %v", tc.policy, tc.bound, got, tc.want)
		}
	}
}

func TestTierScoreIsWeighedAgainstCPUAndMemory(t *testing.T) {
	// A memory-bound label under prism-performance prefers HBM (P100 tier
	// 0, K80 tier 1). The pod asks for 8000 millicores. On the P100 node
	// (10000) that leaves 20 %: LeastAllocated (0.2+1)/2 = 60, Balanced
	// 1-|0.2-1|/2 = 60, DynamicResources 2*100*8/8 = 200: 320. On the K80
	// node (64000): 93 + 93 + 2*(100*7/8 = 87) = 360. kube-scheduler's sum
	// takes the K80; strict tiers take the P100.
	p := machine("p", P100, 1)
	p.CPU = 10000
	mk := func() *Env { return env(t, []Machine{machine("k", K80, 1), p}, &Pod{GPUs: 1, CPU: 8000, Runtime: 10}) }
	for seed := range uint64(20) {
		if mk().assign(seed, 0).label[0] != prismv1alpha1.BoundTypeMemoryBound {
			continue
		}
		if got := simulate(t, mk(), Run{Policy: PrismPerformance, Seed: seed}).OnModel; got != [numModels]int{K80: 1} {
			t.Errorf("weighted sum placed %v, want on the K80", got)
		}
		if got := simulate(t, mk(), Run{Policy: PrismPerformance, Seed: seed, StrictTiers: true}).OnModel; got != [numModels]int{P100: 1} {
			t.Errorf("strict tiers placed %v, want on the P100", got)
		}
		return
	}
	t.Fatal("no seed in 20 drew a memory-bound job type")
}

func TestDynamicResourcesScore(t *testing.T) {
	for _, tc := range []struct {
		tier, best int
		want       int64
	}{{0, 0, 200}, {1, 0, 174}, {2, 0, 150}, {1, 1, 200}, {2, 1, 2 * (100 * 6 / 7)}} {
		if got := dynamicResourcesScore(tc.tier, tc.best); got != tc.want {
			t.Errorf("tier %d, best %d: %d, want %d", tc.tier, tc.best, got, tc.want)
		}
	}
}

func TestLabelNoiseFlipsTheGivenShare(t *testing.T) {
	pods := make([]*Pod, 2000)
	for i := range pods {
		pods[i] = &Pod{Arrival: float64(i), GPUs: 1, Runtime: 1}
	}
	e := env(t, []Machine{machine("v", V100, 1)}, pods...)
	clean, noisy := e.assign(7, 0), e.assign(7, 0.2)
	if !reflect.DeepEqual(clean.jobType, noisy.jobType) {
		t.Fatal("noise changed the job types")
	}
	wrong := 0
	for i := range pods {
		if clean.label[i] != e.jobTypes[clean.jobType[i]].Bound() {
			t.Fatalf("pod %d: clean label %s is not the classifier's", i, clean.label[i])
		}
		if noisy.label[i] != clean.label[i] {
			wrong++
		}
	}
	// Binomial(2000, 0.2): mean 400, sd 17.9; 5 sd either side.
	if wrong < 310 || wrong > 490 {
		t.Errorf("%d of 2000 labels wrong, want about 400", wrong)
	}
}

func TestSeedsAreReproducible(t *testing.T) {
	var pods []*Pod
	for i := range 60 {
		pods = append(pods, &Pod{Arrival: float64(3 * i), GPUs: 1 + i%2, Runtime: float64(50 + 7*i)})
	}
	e := env(t, []Machine{machine("k", K80, 2), machine("p", P100, 2), machine("v", V100, 2)}, pods...)
	a := simulate(t, e, Run{Policy: PrismPerformance, Noise: 0.2, Seed: 5})
	b := simulate(t, e, Run{Policy: PrismPerformance, Noise: 0.2, Seed: 5})
	if !reflect.DeepEqual(a, b) {
		t.Errorf("same seed, different results:\n%+v\n%+v", a, b)
	}
	c := simulate(t, e, Run{Policy: PrismPerformance, Noise: 0.2, Seed: 6})
	if a.MeanJCT == c.MeanJCT {
		t.Errorf("seeds 5 and 6 gave the same mean JCT %v: the seed does not reach the draws", a.MeanJCT)
	}
}

func TestLoadCompressesArrivals(t *testing.T) {
	// Demand 2 pods * 100 GPU-s over a span of 100 s plus one mean gap
	// (50 s): at load 0.5 on one GPU the factor is 200/(0.5*1)/150 = 8/3,
	// so the second pod arrives at 266.7, after the first has finished.
	e := env(t, []Machine{machine("v", V100, 1)},
		&Pod{Arrival: 0, GPUs: 1, Runtime: 100},
		&Pod{Arrival: 100, GPUs: 1, Runtime: 100})
	r := simulate(t, e, Run{Policy: Blind, NullSpeed: true, Compression: 0, Load: 0.5})
	near(t, "mean wait", r.MeanWait, 0)
	r = simulate(t, e, Run{Policy: Blind, NullSpeed: true, Compression: 0, Load: 1.5})
	// Factor 200/1.5/150 = 0.889: the second arrives at 88.9, waits 11.1.
	near(t, "mean wait at 150%", r.MeanWait, (100-100*200/1.5/150)/2)
}

func TestFeasibleNodesToFind(t *testing.T) {
	for _, tc := range []struct{ n, want int }{{50, 50}, {100, 100}, {200, 100}, {1000, 420}, {5000, 500}, {10000, 500}} {
		if got := feasibleToFind(tc.n); got != tc.want {
			t.Errorf("feasibleToFind(%d) = %d, want %d", tc.n, got, tc.want)
		}
	}
}

func TestEstimateConfidenceInterval(t *testing.T) {
	// 1, 2, 3: mean 2, sd 1, t(2 df) = 4.303, half = 4.303/sqrt(3).
	e := estimate([]float64{1, 2, 3})
	near(t, "mean", e.Mean, 2)
	near(t, "half-width", e.Half, 4.303/math.Sqrt(3))
}

func TestSubsampleKeepsEveryGroup(t *testing.T) {
	var ms []Machine
	for range 5 {
		ms = append(ms, machine("p", P100, 2))
	}
	ms = append(ms, machine("v8", V100, 8), machine("v1", V100, 1))
	got := Subsample(ms, 4)
	// P100x2: indexes 0 and 4; one of each V100 size.
	if len(got) != 4 {
		t.Errorf("kept %d machines, want 4: %+v", len(got), got)
	}
}

func TestLoadAwareYieldsTheTopClassToPendingMultiGPUClaims(t *testing.T) {
	// Bandwidth classes {V100, P100} | {K80}. Pod 0 (2 GPUs) takes the
	// V100 node; pod 1 (2 GPUs) waits for it; pod 2 (1 GPU, memory-bound)
	// then sees 1 free top-class device (the P100) against 2 pending
	// multi-GPU devices and yields: it goes to the K80, where performance
	// puts it on the P100.
	mk := func() *Env {
		return env(t, []Machine{machine("k", K80, 1), machine("p", P100, 1), machine("v", V100, 2)},
			&Pod{Arrival: 0, GPUs: 2, Runtime: 100},
			&Pod{Arrival: 1, GPUs: 2, Runtime: 100},
			&Pod{Arrival: 2, GPUs: 1, Runtime: 10})
	}
	for seed := range uint64(50) {
		e := mk()
		if e.assign(seed, 0).label[2] != prismv1alpha1.BoundTypeMemoryBound {
			continue
		}
		if got := simulate(t, e, Run{Policy: PrismLoadAware, Seed: seed}).OnModel; got != [numModels]int{K80: 1, V100: 2} {
			t.Errorf("load-aware placed %v, want the single-GPU pod on the K80", got)
		}
		if got := simulate(t, mk(), Run{Policy: PrismPerformance, Seed: seed}).OnModel; got != [numModels]int{P100: 1, V100: 2} {
			t.Errorf("performance placed %v, want the single-GPU pod on the P100", got)
		}
		return
	}
	t.Fatal("no seed in 50 drew a memory-bound third pod")
}

func TestKubeIgnoresThePinBlindHonoursIt(t *testing.T) {
	// A pod pinned to K80 on a fleet whose K80 is busy: kube starts it on
	// the free V100 at once, blind waits for the K80.
	pods := func() []*Pod {
		return []*Pod{{Arrival: 0, GPUs: 1, Runtime: 100, Allowed: 1 << K80}, {Arrival: 1, GPUs: 1, Runtime: 100, Allowed: 1 << K80}}
	}
	fleet := []Machine{machine("k", K80, 1), machine("v", V100, 1)}
	if r := simulate(t, env(t, fleet, pods()...), Run{Policy: Kube, NullSpeed: true}); r.MeanWait != 0 {
		t.Errorf("kube: mean wait %v, want 0", r.MeanWait)
	}
	if r := simulate(t, env(t, fleet, pods()...), Run{Policy: Blind, NullSpeed: true}); r.MeanWait != 99.0/2 {
		t.Errorf("blind: mean wait %v, want 49.5", r.MeanWait)
	}
}

func TestVerdictComparesBestPrismWithBestProfileFree(t *testing.T) {
	row := func(p Policy, noise, median, p99, wait float64) *Result {
		return &Result{Run: Run{Policy: p, Load: 0.7, Noise: noise}, MedianSlowdown: median, P99Slowdown: p99, MultiGPUWait: wait}
	}
	rows := Summarise([]*Result{
		row(Blind, 0, 3, 10, 100),
		row(FastestFree, 0, 2, 9, 500),
		row(Oracle, 0, 1, 9, 100), // not profile-free: left out
		row(PrismPerformance, 0, 1.6, 9, 100),
		row(PrismLoadAware, 0, 1.5, 11, 80),
		row(PrismPerformance, 0.2, 2.1, 9, 100),
		row(PrismLoadAware, 0.2, 1.9, 9, 100),
	})
	got := Verdict(rows, 0.7)
	if len(got) != 1 {
		t.Fatalf("%d verdict lines, want 1: %v", len(got), got)
	}
	for _, want := range []string{
		// 2 / 1.5 = 1.33.
		"best Prism prism-load-aware median 1.50 vs best profile-free fastest-free 2.00: 1.33x (goal >= 1.3x: holds)",
		"p99 11.0 vs blind 10.0 (fails)",
		"multi-GPU wait 80.0 vs blind 100 (holds)",
		// 2 / 1.9 = 1.05.
		"at 20% wrong labels prism-load-aware median 1.90, gain over best profile-free 1.05x (holds)",
	} {
		if !strings.Contains(got[0], want) {
			t.Errorf("verdict lacks %q:\n%s", want, got[0])
		}
	}
	if v := Verdict(rows, 0.8); len(v) != 0 {
		t.Errorf("no load >= 80%%, yet %v", v)
	}
}

// The verdict's ratios are printed so that they never contradict it: one
// that two decimals would round across its goal gets the decimals it takes,
// and the goal is 1.3x, not 1.3x less a tolerance the line does not show.
func TestVerdictPrintsTheRatioItJudges(t *testing.T) {
	for _, tc := range []struct {
		name            string
		free, prism20   float64
		ratio, gain     string
		holds, gainHold string
	}{
		{name: "just below the goal", free: 1.299, prism20: 1.299, ratio: "1.299", gain: "1.00", holds: "fails", gainHold: "holds"},
		{name: "below the goal within half a per cent", free: 1.294, prism20: 1.294, ratio: "1.29", gain: "1.00", holds: "fails", gainHold: "holds"},
		{name: "at the goal", free: 1.3, prism20: 1.3, ratio: "1.30", gain: "1.00", holds: "holds", gainHold: "holds"},
		{name: "20% wrong labels just worse", free: 1.5, prism20: 1.5 / 0.99501, ratio: "1.50", gain: "0.995", holds: "holds", gainHold: "fails"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			row := func(p Policy, noise, median float64) *Result {
				return &Result{Run: Run{Policy: p, Load: 0.7, Noise: noise}, MedianSlowdown: median, P99Slowdown: 1, MultiGPUWait: 1}
			}
			rows := Summarise([]*Result{row(Blind, 0, 3), row(FastestFree, 0, tc.free), row(PrismPerformance, 0, 1), row(PrismPerformance, 0.2, tc.prism20)})
			got := Verdict(rows, 0.7)
			want := []string{fmt.Sprintf("load 70%%: best Prism prism-performance median 1.00 vs best profile-free fastest-free %s: %sx (goal >= 1.3x: %s)"+
				"; p99 1.00 vs blind 1.00 (holds); multi-GPU wait 1.00 vs blind 1.00 (holds)"+
				"; at 20%% wrong labels prism-performance median %s, gain over best profile-free %sx (%s)",
				num(tc.free), tc.ratio, tc.holds, num(tc.prism20), tc.gain, tc.gainHold)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMeasuredRunsPutTheFasterModelOfAClassFirst(t *testing.T) {
	// CycleGAN is memory-bound and runs at half its V100 speed on a P100,
	// whose published bandwidth (732 GB/s) puts it in the V100's class.
	e := env(t, []Machine{machine("k", K80, 1), machine("p", P100, 1), machine("v", V100, 1)}, &Pod{GPUs: 1, Runtime: 1})
	j := slices.IndexFunc(e.jobTypes, func(t JobType) bool { return t.Name == "CycleGAN" })
	if j < 0 || e.jobTypes[j].Bound() != prismv1alpha1.BoundTypeMemoryBound {
		t.Fatalf("CycleGAN is not a memory-bound job type of the shipped data")
	}
	if e.newOutcomes(&Run{Policy: PrismEconomy}) != nil {
		t.Error("economy reads measured runs; it keeps the top class free whatever they say")
	}
	o := e.newOutcomes(&Run{Policy: PrismPerformance, Seed: 1})
	for i, m := range []ModelID{V100, P100, V100} {
		o.finished(j, e.jobTypes[j].Speed(m), e.ModelNames[m], float64(i))
		if o.of(j) != nil {
			t.Fatalf("after %d runs the usage ranks models; it needs %d on each of two", i+1, rewrite.MinMeasuredRuns)
		}
	}
	o.finished(j, e.jobTypes[j].Speed(P100), e.ModelNames[P100], 3)
	u := o.of(j)
	if u == nil {
		t.Fatal("two runs on each of two models do not rank them")
	}
	got, err := e.rewriteTiers(prismv1alpha1.PolicyPerformance, prismv1alpha1.BoundTypeMemoryBound, 1, nil, u)
	if err != nil {
		t.Fatal(err)
	}
	if want := (tiers{K80: 2, P100: 1, V100: 0}); got != want {
		t.Errorf("tiers %v, want %v (the published ladder is %v)", got, want, e.prism[prismv1alpha1.PolicyPerformance][prismv1alpha1.BoundTypeMemoryBound])
	}
}
