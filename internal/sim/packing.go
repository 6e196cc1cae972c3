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
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// PackPolicy decides which GPU a job of the packing evaluation starts on.
type PackPolicy string

// The packing policies. Only PackOracle reads the pair table; the others
// read jobs.csv (PackPrism through the share-sizing rule, with noise).
const (
	// PackWhole gives every job a GPU of its own: the NVIDIA DRA driver's
	// default for a claim of one GPU.
	PackWhole PackPolicy = "whole-gpu"
	// PackMemory joins any running job whose memory leaves room for the
	// newcomer's, fullest GPU first: HAMi's and nano-gpu's binpack, which
	// share by declared memory.
	PackMemory PackPolicy = "by-memory"
	// PackRandom joins a running job picked at random.
	PackRandom PackPolicy = "random-pair"
	// PackPrism sizes a share from the job's measured use (SizeShare) and
	// joins a share whose compute leaves room for it; a heavy or unprofiled
	// job gets a GPU of its own that nobody joins.
	PackPrism PackPolicy = "prism"
	// PackOracle reads the judge's pair table: it joins the running job
	// that gives the largest sum of the two speeds with both at or above
	// the interference target's 80 %. A greedy, online bound, not the best
	// any scheduler could do.
	PackOracle PackPolicy = "oracle"
)

// PackPolicies is every packing policy, in table order.
var PackPolicies = []PackPolicy{PackWhole, PackMemory, PackRandom, PackPrism, PackOracle}

// ParsePackPolicy checks a policy name.
func ParsePackPolicy(s string) (PackPolicy, error) {
	for _, p := range PackPolicies {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, len(PackPolicies))
	for i, p := range PackPolicies {
		names[i] = string(p)
	}
	return "", fmt.Errorf("unknown packing policy %q (want one of %s)", s, strings.Join(names, ", "))
}

// profiled policies read the usage profile, so profile noise applies.
func (p PackPolicy) profiled() bool { return p == PackPrism }

// profileFree policies are what a cluster without usage profiles can do.
func (p PackPolicy) profileFree() bool { return p == PackWhole || p == PackMemory || p == PackRandom }

// SizeShare sizes a job's share with the admission controller's own rule,
// rewrite.SizeShare, so that the evaluation cannot drift from what ships.
// A job that rule keeps whole (heavy, or unmeasured) gets ok false.
// memKnown false means no peak memory was measured: production then keeps
// the whole GPU, and the evaluation, on data without memory, sizes compute
// alone (the share names no memory). util, a job's one utilisation figure
// (a mean over its run in the shipped data), is read as both its p50 and
// its p95 duty cycle: the data has no spread, so the share's request is
// its limit, and the evaluation judges requests alone.
func SizeShare(util, peakMiB float64, memKnown bool) (gpuv1alpha1.Share, bool) {
	return sizeShareWith(rewrite.DefaultShareRule, util, peakMiB, memKnown)
}

func sizeShareWith(rule rewrite.ShareRule, util, peakMiB float64, memKnown bool) (gpuv1alpha1.Share, bool) {
	if !Known(util) || (memKnown && !Known(peakMiB)) {
		return gpuv1alpha1.Share{}, false
	}
	if !memKnown {
		peakMiB = 1 // a stand-in: production keeps a job without a peak whole
	}
	size := rule.Size(measuredUsage(util, peakMiB))
	if size.Verdict != rewrite.ShareSized {
		return gpuv1alpha1.Share{}, false
	}
	if !memKnown {
		size.Share.MemoryBytes = 0
	}
	return size.Share, true
}

// measuredUsage is a job's measured figures as the usage profile the
// admission controller's rules read: util, its one utilisation figure, as
// both its p50 and its p95 duty cycle, and peakMiB as its peak memory.
func measuredUsage(util, peakMiB float64) *prismv1alpha1.UsageProfile {
	duty := ptr.To(milliPercent(util))
	return &prismv1alpha1.UsageProfile{
		Runs:                     1,
		DutyCycleP50MilliPercent: duty,
		DutyCycleP95MilliPercent: duty,
		PeakMemory:               resource.NewQuantity(int64(math.Ceil(peakMiB*(1<<20))), resource.BinarySI),
	}
}

// milliPercent is a per cent figure in thousandths, within 0 to 100 %.
func milliPercent(pct float64) int32 { return int32(math.Round(min(max(pct, 0), 100) * 1000)) }

// PackingData is the measured data for one GPU model: the job types a
// stream is drawn from and the judge's pair speeds.
type PackingData struct {
	GPU string
	// MemMiB is the GPU's memory; MemoryKnown says every job type has a
	// measured memory figure. Without it no policy checks memory, and the
	// judge's out-of-memory pairs are what catches a bad pairing.
	MemMiB      float64
	MemoryKnown bool
	Jobs        []MeasuredJob
	// Dropped are the job types of the GPU model left out because the pair
	// table lacks a pair of them (ForGPUSkipIncomplete), in the order they
	// were dropped.
	Dropped []DroppedJob
	// Clamped names the pair speeds on this GPU model read as 1 (see
	// SpeedTolerance).
	Clamped []string
	// speed[i][j] is job type i's speed beside j, a fraction of alone.
	speed [][]float64
	// rule sizes prism's shares; nil is rewrite.DefaultShareRule.
	rule *rewrite.ShareRule
}

// WithShareRule is d with prism's shares sized by rule instead of the rule
// that ships: for measuring how the evaluation depends on its parameters.
func (d *PackingData) WithShareRule(rule rewrite.ShareRule) *PackingData {
	c := *d
	c.rule = &rule
	return &c
}

// sizeShare sizes a job's share under d's rule (SizeShare).
func (d *PackingData) sizeShare(util, peakMiB float64) (gpuv1alpha1.Share, bool) {
	if d.rule == nil {
		return SizeShare(util, peakMiB, d.MemoryKnown)
	}
	return sizeShareWith(*d.rule, util, peakMiB, d.MemoryKnown)
}

// DroppedJob is a job type left out of the packing evaluation and the
// pairs the table lacks of it with the job types still in when it was.
type DroppedJob struct {
	Job   string
	Lacks []string
}

// GPUMemoryMiB is the memory of the GPU models the shipped data covers
// (Gavel's K80 is one GK210 die; the H100's is what NVML reported on the
// card the pairs were measured on); other models need it given.
var GPUMemoryMiB = map[string]float64{"k80": 12 << 10, "p100": 16 << 10, "v100": 16 << 10, "a100-40gb": 40 << 10,
	"h100": 81559, "h100-mps": 81559}

// GPUMemoryModels lists the GPU models of GPUMemoryMiB, sorted.
func GPUMemoryModels() []string {
	out := make([]string, 0, len(GPUMemoryMiB))
	for g := range GPUMemoryMiB {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// ForGPU picks one GPU model's job types and pairs. Every pair of its job
// types, self-pairs included, must be in the pair table: the judge has no
// way to rate one that is not, and leaving such pairs out of the policies'
// reach would tell them what the judge knows. The error counts the missing
// pairs and names the first MissingPairsNamed.
func (m *Measured) ForGPU(gpu string, memMiB float64) (*PackingData, error) {
	return m.forGPU(gpu, memMiB, false)
}

// ForGPUSkipIncomplete is ForGPU on a pair table that lacks some pairs: it
// leaves out job types, one at a time, the one lacking the most pairs with
// the job types still in first (the later in the jobs file on a tie),
// until every pair of those left is in the table, and names them in
// Dropped. The stream is then drawn from the job types left.
func (m *Measured) ForGPUSkipIncomplete(gpu string, memMiB float64) (*PackingData, error) {
	return m.forGPU(gpu, memMiB, true)
}

func (m *Measured) forGPU(gpu string, memMiB float64, skipIncomplete bool) (*PackingData, error) {
	d := &PackingData{GPU: gpu, MemMiB: memMiB, MemoryKnown: true}
	index := map[string]int{}
	var jobs []MeasuredJob
	for _, j := range m.Jobs {
		if j.GPU == gpu {
			index[j.Job] = len(jobs)
			jobs = append(jobs, j)
		}
	}
	if len(jobs) == 0 {
		return nil, fmt.Errorf("no job measured on gpu %q (gpus: %s)", gpu, strings.Join(m.GPUs(), ", "))
	}
	n := len(jobs)
	speed := make([][]float64, n)
	for i := range speed {
		speed[i] = make([]float64, n)
		for k := range speed[i] {
			speed[i][k] = math.NaN()
		}
	}
	pairs := 0
	for _, p := range m.Pairs {
		// A pair with empty speeds was not measured: it stays missing.
		if p.GPU != gpu || !Known(p.SpeedA) {
			continue
		}
		pairs++
		d.Clamped = append(d.Clamped, p.Clamped...)
		a, b := index[p.JobA], index[p.JobB]
		speed[a][b], speed[b][a] = p.SpeedA, p.SpeedB
		if a == b {
			// Two jobs of one type: each is one of the two.
			speed[a][a] = (p.SpeedA + p.SpeedB) / 2
		}
	}
	if pairs == 0 {
		return nil, fmt.Errorf("gpu %q: the pair table has no pair on this gpu", gpu)
	}
	kept := make([]int, n)
	for i := range kept {
		kept[i] = i
	}
	// lacks lists the pairs of job type i with the kept ones (i with
	// itself included) that the table does not have.
	lacks := func(i int) []string {
		var out []string
		for _, k := range kept {
			if math.IsNaN(speed[i][k]) {
				a, b := i, k
				if b < a {
					a, b = b, a
				}
				out = append(out, fmt.Sprintf("%s + %s", jobs[a].Job, jobs[b].Job))
			}
		}
		return out
	}
	if !skipIncomplete {
		var missing []string
		for x, i := range kept {
			for _, k := range kept[x:] {
				if math.IsNaN(speed[i][k]) {
					missing = append(missing, fmt.Sprintf("%s + %s", jobs[i].Job, jobs[k].Job))
				}
			}
		}
		if len(missing) > 0 {
			return nil, fmt.Errorf("gpu %q: the pair table lacks %d of the %d pairs of its job types (--skip-incomplete leaves out job types until none is missing): %s",
				gpu, len(missing), n*(n+1)/2, firstFew(missing, MissingPairsNamed, "; "))
		}
	}
	for {
		worst, most := -1, 0
		for x, i := range kept {
			if l := len(lacks(i)); l >= most && l > 0 {
				worst, most = x, l
			}
		}
		if worst < 0 {
			break
		}
		i := kept[worst]
		d.Dropped = append(d.Dropped, DroppedJob{Job: jobs[i].Job, Lacks: lacks(i)})
		kept = slices.Delete(kept, worst, worst+1)
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("gpu %q: no job type is left with every pair in the pair table", gpu)
	}
	d.speed = make([][]float64, len(kept))
	for x, i := range kept {
		d.Jobs = append(d.Jobs, jobs[i])
		d.MemoryKnown = d.MemoryKnown && Known(jobs[i].MemMiB)
		d.speed[x] = make([]float64, len(kept))
		for y, k := range kept {
			d.speed[x][y] = speed[i][k]
		}
	}
	if d.MemoryKnown && memMiB <= 0 {
		return nil, fmt.Errorf("gpu %q: its memory is needed to check memory fits (--gpu-memory; built in for %s)", gpu, strings.Join(GPUMemoryModels(), ", "))
	}
	return d, nil
}

// MissingPairsNamed is how many missing pairs ForGPU's error, and the
// report for each job type left out, name: a table measured for part of
// the job types lacks hundreds, and the first few with the count say what
// is wrong.
const MissingPairsNamed = 5

// firstFew joins the first n of list with sep and says how many more
// there are.
func firstFew(list []string, n int, sep string) string {
	if len(list) <= n {
		return strings.Join(list, sep)
	}
	return fmt.Sprintf("%s%sand %d more", strings.Join(list[:n], sep), sep, len(list)-n)
}

// GPUs lists the GPU models the jobs file covers.
func (m *Measured) GPUs() []string {
	var out []string
	for _, j := range m.Jobs {
		if !slices.Contains(out, j.GPU) {
			out = append(out, j.GPU)
		}
	}
	return out
}

// streamJob is one arrival; its figures are fixed per seed so that every
// policy and GPU count sees the same stream (common random numbers).
type streamJob struct {
	typ          int
	arrive, work float64
	// noise is the multiplicative error drawn for this job's profile, in
	// [-1, 1]; a run scales it by its noise level.
	noise float64
}

// PackRun is one simulation of the packing evaluation.
type PackRun = GridRun[PackPolicy]

// PackResult is what one run measured, over the middle 60 % of arrivals
// (the first 20 % warm the GPUs up, the last 20 % drain).
type PackResult struct {
	PackRun
	// Goodput is the sum of running jobs' speeds (each a fraction of its
	// speed alone) over the GPUs holding a job, time-averaged.
	Goodput float64
	// Below80 and Below90 are the shares of jobs whose speed while running
	// (work over run time) fell below 80 and 90 % of alone; a job that hit
	// an out-of-memory pairing counts below both.
	Below80, Below90 float64
	// Median and P99 slowdown: (finish − arrival) / work alone, waiting
	// included.
	Median, P99 float64
	// Late is the share of jobs with slowdown above 1.25 (finishing later
	// than at 80 % speed, waiting included): the serving criterion.
	Late float64
	// OOMs is out-of-memory starts per 1000 jobs.
	OOMs float64
	// Paired is the share of busy GPU time with two jobs.
	Paired float64
}

type runningJob struct {
	sj        *streamJob
	idx       int
	remaining float64
	start     float64
	speed     float64
	share     gpuv1alpha1.Share
	exclusive bool
	oomed     bool
}

// Simulate runs one configuration of the packing evaluation.
func (d *PackingData) Simulate(r PackRun) PackResult {
	return d.simulate(r, r.stream(len(d.Jobs)))
}

// simulate is event-driven: arrivals and completions; at each, every job's
// speed is the judge's figure for its current partner (1 alone). Jobs that
// fit nowhere wait and are retried in arrival order after every event.
func (d *PackingData) simulate(r PackRun, jobs []streamJob) PackResult {
	rng := rand.New(rand.NewPCG(r.Seed, 0x7469))
	gpus := make([][]*runningJob, r.GPUs)
	var queue []*runningJob
	rec := newStreamLog(jobs)
	var good, busy, paired float64

	setSpeeds := func(g int) {
		switch on := gpus[g]; len(on) {
		case 1:
			on[0].speed = 1
		case 2:
			on[0].speed = d.speed[on[0].sj.typ][on[1].sj.typ]
			on[1].speed = d.speed[on[1].sj.typ][on[0].sj.typ]
		}
	}
	place := func(j *runningJob) int {
		empty := -1
		best, bestScore := -1, math.Inf(-1)
		for g, on := range gpus {
			switch len(on) {
			case 0:
				if empty < 0 {
					empty = g
				}
				continue
			case 2:
				continue
			}
			other := on[0]
			if j.exclusive || other.exclusive {
				continue
			}
			var score float64
			switch r.Policy {
			case PackWhole:
				continue
			case PackMemory:
				mj, mo := d.Jobs[j.sj.typ].MemMiB, d.Jobs[other.sj.typ].MemMiB
				if d.MemoryKnown {
					if mj+mo > d.MemMiB {
						continue
					}
					score = mo
				} else {
					score = -float64(g)
				}
			case PackRandom:
				score = rng.Float64()
			case PackPrism:
				if j.share.ComputePercent+other.share.ComputePercent > gpuv1alpha1.MaxComputePercent {
					continue
				}
				if d.MemoryKnown && float64(j.share.MemoryBytes+other.share.MemoryBytes)/(1<<20) > d.MemMiB {
					continue
				}
				score = float64(j.share.ComputePercent + other.share.ComputePercent)
			case PackOracle:
				a, b := d.speed[j.sj.typ][other.sj.typ], d.speed[other.sj.typ][j.sj.typ]
				if a < 0.8 || b < 0.8 {
					continue
				}
				score = a + b
			}
			if score > bestScore {
				best, bestScore = g, score
			}
		}
		if best >= 0 {
			return best
		}
		return empty
	}
	schedule := func(now float64) {
		kept := queue[:0]
		for _, j := range queue {
			g := place(j)
			if g < 0 {
				kept = append(kept, j)
				continue
			}
			if len(gpus[g]) == 1 {
				other := gpus[g][0]
				if d.speed[j.sj.typ][other.sj.typ] == 0 || d.speed[other.sj.typ][j.sj.typ] == 0 {
					// It did not fit in memory: the start fails and the job
					// is run again on a GPU of its own.
					rec.oom(j.idx)
					j.exclusive = true
					if g = place(j); g < 0 {
						kept = append(kept, j)
						continue
					}
				}
			}
			j.start = now
			rec.started[j.idx] = now
			gpus[g] = append(gpus[g], j)
			setSpeeds(g)
		}
		queue = kept
	}

	next, now := 0, 0.0
	for next < len(jobs) || len(queue) > 0 || anyRunning(gpus) {
		// The next completion.
		dt, gDone, kDone := math.Inf(1), -1, -1
		for g, on := range gpus {
			for k, j := range on {
				if t := j.remaining / j.speed; t < dt {
					dt, gDone, kDone = t, g, k
				}
			}
		}
		arrival := next < len(jobs) && jobs[next].arrive-now <= dt
		if arrival {
			dt = jobs[next].arrive - now
		}
		// Advance every running job by dt, counting the window's goodput.
		from, to := rec.window(now, dt)
		for _, on := range gpus {
			for _, j := range on {
				j.remaining -= j.speed * dt
				if to > from {
					good += j.speed * (to - from)
				}
			}
			if to > from && len(on) > 0 {
				busy += to - from
				if len(on) == 2 {
					paired += to - from
				}
			}
		}
		now += dt
		if arrival {
			sj := &jobs[next]
			j := &runningJob{sj: sj, idx: next, remaining: sj.work}
			if r.Policy == PackPrism {
				t := d.Jobs[sj.typ]
				f := 1 + r.Noise*sj.noise
				share, ok := d.sizeShare(math.Min(100, t.UtilPct*f), t.MemMiB*f)
				j.share, j.exclusive = share, !ok
			}
			queue = append(queue, j)
			next++
		} else {
			done := gpus[gDone][kDone]
			rec.finish[done.idx] = now
			gpus[gDone] = slices.Delete(gpus[gDone], kDone, kDone+1)
			setSpeeds(gDone)
		}
		schedule(now)
	}

	res := PackResult{PackRun: r, OOMs: rec.oomsPer1000()}
	var shares []float64
	shares, res.Median, res.P99 = rec.judge(
		func(i int, _, speed float64) bool { return rec.oomed[i] || speed < 0.8-1e-9 },
		func(i int, _, speed float64) bool { return rec.oomed[i] || speed < 0.9-1e-9 },
		func(_ int, slowdown, _ float64) bool { return slowdown > 1.25+1e-9 })
	res.Below80, res.Below90, res.Late = shares[0], shares[1], shares[2]
	if busy > 0 {
		res.Goodput, res.Paired = good/busy, paired/busy
	}
	return res
}

func anyRunning(gpus [][]*runningJob) bool {
	for _, on := range gpus {
		if len(on) > 0 {
			return true
		}
	}
	return false
}

// GPUsNeeded is the fewest GPUs that serve the stream of a run (its rate
// fixed by Load × GPUs) with at most target of its jobs late (slowdown above
// 1.25, waiting included); NaN when even 4 × GPUs do not.
func (d *PackingData) GPUsNeeded(r PackRun, target float64) float64 {
	return gpusNeeded(r, len(d.Jobs), target, func(r PackRun, jobs []streamJob) float64 { return d.simulate(r, jobs).Late })
}

// medianP99 is the median and the 99th percentile of the slowdowns of a
// run's measured jobs. It sorts slow.
func medianP99(slow []float64) (median, p99 float64) {
	slices.Sort(slow)
	return slow[len(slow)/2], quantile(slow, 0.99)
}

// fewestGPUs is the least n in 1..most for which serves(n) holds, by
// bisection, since more GPUs never serve a stream worse; NaN when even
// most does not.
func fewestGPUs(most int, serves func(n int) bool) float64 {
	if !serves(most) {
		return math.NaN()
	}
	lo, hi := 1, most
	for lo < hi {
		mid := (lo + hi) / 2
		if serves(mid) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return float64(lo)
}
