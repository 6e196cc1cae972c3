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
	"container/heap"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Run is one simulation: a policy at one load and label-noise level, with
// the job types and labels a seed draws.
type Run struct {
	Policy Policy
	// Load is the target utilisation: arrivals are compressed so that the
	// trace's demand at observed runtimes fills this share of the fleet's
	// GPUs over the arrival window.
	Load float64
	// Noise is the share of pods whose classifier label is replaced by a
	// different, uniformly drawn one.
	Noise float64
	Seed  uint64
	// StrictTiers makes the best subrequest decide before any other score,
	// instead of kube-scheduler's weighted sum, where a much emptier node
	// offering a later subrequest can win: a sensitivity setting.
	StrictTiers bool
	// Compression, when set, multiplies arrival times directly instead of
	// deriving the factor from Load.
	Compression float64
	// NullSpeed makes every GPU equally fast and every runtime the
	// observed one: the reference run that shows what queueing alone does.
	NullSpeed bool
}

// Result is what one run measured. Times are seconds; slowdown is JCT
// divided by the pod's runtime alone on a V100 (its observed runtime in a
// null-speed run). Censored pods are in none of the figures.
type Result struct {
	Run
	Pods           int     `json:"pods"`
	MedianSlowdown float64 `json:"medianSlowdown"`
	P99Slowdown    float64 `json:"p99Slowdown"`
	MeanJCT        float64 `json:"meanJCTSeconds"`
	// MultiGPUWait is the mean wait of pods asking for two or more GPUs.
	MultiGPUWait float64 `json:"multiGPUWaitSeconds"`
	MeanWait     float64 `json:"meanWaitSeconds"`
	// Fragmentation is the mean, over arrivals, of the share of free whole
	// GPUs that sit on partly used nodes.
	Fragmentation float64 `json:"fragmentation"`
	// Utilisation is the mean share of the fleet's GPUs busy (shares
	// counted by their milli) between the first and the last arrival of
	// the measured pods.
	Utilisation float64 `json:"utilisation"`
	// OnModel counts the pods started per model.
	OnModel [numModels]int `json:"onModel"`
}

// assignment is what a seed draws for every pod: its job type and the
// label the classifier hands Prism at each noise level.
type assignment struct {
	jobType []int
	label   []prismv1alpha1.BoundType
}

func (e *Env) assign(seed uint64, noise float64) assignment {
	// Job types and the noise draws use separate streams, so that every
	// noise level sees the same job types and a higher level flips a
	// superset of the labels a lower one flips.
	types := rand.New(rand.NewPCG(seed, 0x6a6f62))
	flips := rand.New(rand.NewPCG(seed, 0x6e6f6973))
	a := assignment{jobType: make([]int, len(e.Pods)), label: make([]prismv1alpha1.BoundType, len(e.Pods))}
	for i := range e.Pods {
		a.jobType[i] = types.IntN(len(e.jobTypes))
		a.label[i] = e.jobTypes[a.jobType[i]].Bound()
		u, other := flips.Float64(), flips.IntN(len(bounds)-1)
		if u < noise {
			rest := slices.DeleteFunc(slices.Clone(bounds), func(b prismv1alpha1.BoundType) bool { return b == a.label[i] })
			a.label[i] = rest[other%len(rest)]
		}
	}
	return a
}

// speed is how fast pod i's job type runs on m relative to a V100.
func (r *Run) speed(t JobType, m ModelID) float64 {
	if r.NullSpeed {
		return 1
	}
	return t.Speed(m)
}

// work is the pod's runtime alone on a V100. The trace says how long the
// pod ran, not on which GPU: a pinned pod ran on one of its pinned models,
// any other on the fleet's mix, so the observed runtime is taken as the
// expected runtime over the allowed models weighted by their GPU counts.
func (e *Env) work(r *Run, p *Pod, t JobType) float64 {
	if r.NullSpeed {
		return p.Runtime
	}
	var inv, n float64
	for m := range numModels {
		if p.Allowed&(1<<m) != 0 && e.modelGPUs[m] > 0 {
			w := float64(e.modelGPUs[m])
			inv += w / t.Speed(m)
			n += w
		}
	}
	if n == 0 {
		return p.Runtime
	}
	return p.Runtime / (inv / n)
}

// tiersFor is the claim a pod submits under the run's policy, as model
// ranks.
func (e *Env) tiersFor(r *Run, p *Pod, t JobType, label prismv1alpha1.BoundType) tiers {
	var ts tiers
	switch r.Policy {
	case FastestFree:
		ts = tiers{K80: 2, P100: 1, V100: 0}
	case PreferHBM:
		ts = tiers{K80: 1, P100: 0, V100: 0}
	case PrismPerformance:
		ts = e.prism[prismv1alpha1.PolicyPerformance][label]
	case PrismEconomy:
		ts = e.prism[prismv1alpha1.PolicyEconomy][label]
	case Oracle:
		for m := range numModels {
			for o := range numModels {
				if t.Speed(o) > t.Speed(m) {
					ts[m]++
				}
			}
		}
	}
	if r.Policy != Kube {
		ts = pin(ts, p)
	}
	return ts
}

func pin(ts tiers, p *Pod) tiers {
	for m := range numModels {
		if p.Allowed&(1<<m) == 0 {
			ts[m] = noFit
		}
	}
	return ts
}

type node struct {
	m            *Machine
	cpu, mem     int64 // free
	free         []int // free milli per device
	whole, usedG int   // devices entirely free; devices with any use
}

func (n *node) fits(p *Pod) bool {
	if n.cpu < p.CPU || n.mem < p.Memory {
		return false
	}
	if p.Milli >= 1000 {
		return n.whole >= p.GPUs
	}
	for _, f := range n.free {
		if f >= p.Milli {
			return true
		}
	}
	return false
}

// take allocates p's devices first fit, in device order, as the structured
// allocator does, and returns them.
func (n *node) take(p *Pod) []int {
	var devs []int
	for d, f := range n.free {
		if len(devs) == p.GPUs {
			break
		}
		if (p.Milli >= 1000 && f == 1000) || (p.Milli < 1000 && f >= p.Milli) {
			devs = append(devs, d)
		}
	}
	for _, d := range devs {
		if n.free[d] == 1000 {
			n.whole--
		}
		n.free[d] -= min(p.Milli, 1000)
	}
	n.cpu -= p.CPU
	n.mem -= p.Memory
	return devs
}

func (n *node) give(p *Pod, devs []int) {
	for _, d := range devs {
		n.free[d] += min(p.Milli, 1000)
		if n.free[d] == 1000 {
			n.whole++
		}
	}
	n.cpu += p.CPU
	n.mem += p.Memory
}

// score is kube-scheduler's default node scoring for the pod's CPU and
// memory: NodeResourcesFit (LeastAllocated) plus NodeResourcesBalanced
// Allocation, each 0-100 in integers as the framework computes them. GPUs
// claimed through DRA are not node allocatable, so neither sees them.
func (n *node) score(p *Pod) int64 {
	cf := float64(n.cpu-p.CPU) / float64(n.m.CPU)
	mf := float64(n.mem-p.Memory) / float64(n.m.Memory)
	least := int64((cf + mf) * 100 / 2)
	// Balanced: 1 - std of the requested fractions; for two resources the
	// std is half their difference.
	balanced := int64((1 - math.Abs(cf-mf)/2) * 100)
	return least + balanced
}

// dynamicResourcesScore is kube-scheduler's DynamicResources score for a
// claim allocated from subrequest tier on a node: 8 (the most subrequests
// a firstAvailable list may have) minus the index, normalised to 0-100
// against the best node of the cycle, times the plugin's default weight
// of 2. A plain claim scores the same on every node.
func dynamicResourcesScore(tier, minTier int) int64 {
	const maxSubrequests = 8
	return 2 * (100 * int64(maxSubrequests-tier) / int64(maxSubrequests-minTier))
}

// feasibleToFind is kube-scheduler's percentageOfNodesToScore default: in
// clusters above 100 nodes it stops filtering after max(100, n*(50 -
// n/125)%, n*5%) feasible nodes.
func feasibleToFind(n int) int {
	if n <= 100 {
		return n
	}
	pct := max(50-n/125, 5)
	return max(100, n*pct/100)
}

type running struct {
	end  float64
	pod  int
	node int
	devs []int
}

type events []running

func (h events) Len() int { return len(h) }
func (h events) Less(a, b int) bool {
	if h[a].end != h[b].end {
		return h[a].end < h[b].end
	}
	return h[a].pod < h[b].pod
}
func (h events) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *events) Push(x any)   { *h = append(*h, x.(running)) }
func (h *events) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Simulate runs one configuration.
//
// The scheduler model: pods are tried in arrival order; a pod that fits
// nowhere waits and is retried after every completion, in arrival order,
// without head-of-line blocking. A scheduling cycle filters nodes from a
// rotating start until feasibleToFind nodes fit (CPU, memory, and the
// claim: a model the claim accepts with enough whole GPUs, or one GPU with
// a large enough free share), scores them as kube-scheduler's default
// plugins do (DynamicResources, NodeResourcesFit, BalancedAllocation; the
// others score every simulated node alike), takes the best, and breaks
// ties at random. Devices are taken first fit.
func (e *Env) Simulate(r Run) (*Result, error) {
	if r.Compression == 0 && (r.Load <= 0 || r.Load > 1.5) {
		return nil, fmt.Errorf("load %v out of range (0, 1.5]", r.Load)
	}
	a := e.assign(r.Seed, r.Noise)
	rng := rand.New(rand.NewPCG(r.Seed, 0x7469))
	// Compress arrivals to the target load.
	scale := r.Compression
	if scale == 0 && e.span > 0 {
		scale = e.offered / (r.Load * float64(e.GPUs)) / e.span
	}
	nodes := make([]*node, len(e.Machines))
	for i := range e.Machines {
		m := &e.Machines[i]
		n := &node{m: m, cpu: m.CPU, mem: m.Memory, free: make([]int, m.GPUs), whole: m.GPUs}
		for d := range n.free {
			n.free[d] = 1000
		}
		nodes[i] = n
	}
	res := &Result{Run: r}
	ts := make([]tiers, len(e.Pods))
	work := make([]float64, len(e.Pods))
	for i, p := range e.Pods {
		t := e.jobTypes[a.jobType[i]]
		ts[i] = e.tiersFor(&r, p, t, a.label[i])
		work[i] = e.work(&r, p, t)
	}
	var (
		h         events
		queue     []int
		start     int
		now, busy float64
		slowdowns []float64
		sumJCT    float64
		sumWait   float64
		multiWait float64
		multi     int
		fragSum   float64
		fragN     int
		wholeFree = e.GPUs
		idleGPUs  = e.GPUs // whole free GPUs on entirely idle nodes
	)
	want := feasibleToFind(len(nodes))
	runs := e.newOutcomes(&r)
	// The measured window, and the busy GPU-seconds integrated over it.
	from, to := math.Inf(1), math.Inf(-1)
	for i, p := range e.Pods {
		if e.measured[i] {
			from, to = math.Min(from, p.Arrival*scale), math.Max(to, p.Arrival*scale)
		}
	}
	var area, last float64
	advance := func(t float64) {
		lo, hi := math.Max(last, from), math.Min(t, to)
		if hi > lo {
			area += busy * (hi - lo)
		}
		last = t
	}
	begin := func(i, ni int) {
		p, n := e.Pods[i], nodes[ni]
		wasIdle := n.whole == len(n.free) && n.cpu == n.m.CPU && n.mem == n.m.Memory
		w0 := n.whole
		devs := n.take(p)
		wholeFree -= w0 - n.whole
		if wasIdle {
			idleGPUs -= len(n.free)
		}
		t := e.jobTypes[a.jobType[i]]
		run := work[i] / r.speed(t, n.m.Model)
		advance(now)
		busy += float64(p.GPUs*min(p.Milli, 1000)) / 1000
		res.OnModel[n.m.Model]++
		wait := now - p.Arrival*scale
		if e.counts(i) {
			sumWait += wait
			if p.GPUs > 1 {
				multiWait += wait
				multi++
			}
		}
		heap.Push(&h, running{end: now + run, pod: i, node: ni, devs: devs})
	}
	type candidate struct {
		node, tier int
		score      int64
	}
	var cands []candidate
	schedule := func(i int) bool {
		p, t := e.Pods[i], ts[i]
		cands = cands[:0]
		processed, minTier := 0, math.MaxInt
		for k := 0; k < len(nodes) && len(cands) < want; k++ {
			ni := (start + k) % len(nodes)
			processed++
			n := nodes[ni]
			tier := t[n.m.Model]
			if tier == noFit || !n.fits(p) {
				continue
			}
			cands = append(cands, candidate{ni, tier, n.score(p)})
			minTier = min(minTier, tier)
		}
		start = (start + processed) % len(nodes)
		if len(cands) == 0 {
			return false
		}
		best, ties := -1, 0
		var bestTotal int64
		for _, c := range cands {
			total := dynamicResourcesScore(c.tier, minTier) + c.score
			if r.StrictTiers {
				total = c.score - int64(c.tier)<<32
			}
			switch {
			case best < 0 || total > bestTotal:
				best, bestTotal, ties = c.node, total, 1
			case total == bestTotal:
				ties++
				if rng.IntN(ties) == 0 {
					best = c.node
				}
			}
		}
		begin(i, best)
		return true
	}
	next := 0
	for next < len(e.Pods) || h.Len() > 0 {
		if h.Len() > 0 && (next == len(e.Pods) || h[0].end <= e.Pods[next].Arrival*scale) {
			c := heap.Pop(&h).(running)
			now = c.end
			p, n := e.Pods[c.pod], nodes[c.node]
			advance(now)
			busy -= float64(p.GPUs*min(p.Milli, 1000)) / 1000
			w0 := n.whole
			n.give(p, c.devs)
			wholeFree += n.whole - w0
			if n.whole == len(n.free) && n.cpu == n.m.CPU && n.mem == n.m.Memory {
				idleGPUs += len(n.free)
			}
			if p.Milli >= 1000 {
				runs.finished(a.jobType[c.pod], r.speed(e.jobTypes[a.jobType[c.pod]], n.m.Model), e.ModelNames[n.m.Model], now)
			}
			if e.counts(c.pod) {
				jct := now - p.Arrival*scale
				sumJCT += jct
				slowdowns = append(slowdowns, jct/work[c.pod])
			}
			// Only this node gained room: every queued pod fit nowhere
			// when it was last tried, so this node is the only place it
			// can fit now.
			kept := queue[:0]
			for qi, i := range queue {
				if n.whole == 0 && slices.Max(n.free) == 0 {
					kept = append(kept, queue[qi:]...)
					break
				}
				if ts[i][n.m.Model] != noFit && n.fits(e.Pods[i]) {
					begin(i, c.node)
					continue
				}
				kept = append(kept, i)
			}
			queue = kept
			continue
		}
		i := next
		next++
		now = e.Pods[i].Arrival * scale
		var load *rewrite.Load
		if r.Policy == PrismLoadAware {
			load = &rewrite.Load{Free: map[string]int{}}
			for _, n := range nodes {
				load.Free[e.ModelNames[n.m.Model]] += n.whole
			}
			for _, q := range queue {
				load.Pending = append(load.Pending, rewrite.Pending{Devices: e.Pods[q].GPUs, BoundType: a.label[q]})
			}
		}
		if u := runs.of(a.jobType[i]); load != nil || u != nil {
			t, err := e.rewriteTiers(prismv1alpha1.Policy(strings.TrimPrefix(string(r.Policy), "prism-")), a.label[i], e.Pods[i].GPUs, load, u)
			if err != nil {
				return nil, fmt.Errorf("%s rewrite: %w", r.Policy, err)
			}
			ts[i] = pin(t, e.Pods[i])
		}
		if wholeFree > 0 && e.measured[i] {
			fragSum += 1 - float64(idleGPUs)/float64(wholeFree)
			fragN++
		}
		if !schedule(i) {
			queue = append(queue, i)
		}
	}
	if len(queue) > 0 {
		return nil, fmt.Errorf("%d pods never started: no node can hold them", len(queue))
	}
	res.Pods = len(slowdowns)
	if res.Pods == 0 {
		return res, nil
	}
	slices.Sort(slowdowns)
	res.MedianSlowdown = quantile(slowdowns, 0.5)
	res.P99Slowdown = quantile(slowdowns, 0.99)
	res.MeanJCT = sumJCT / float64(res.Pods)
	res.MeanWait = sumWait / float64(res.Pods)
	if multi > 0 {
		res.MultiGPUWait = multiWait / float64(multi)
	}
	if fragN > 0 {
		res.Fragmentation = fragSum / float64(fragN)
	}
	if to > from {
		res.Utilisation = area / (float64(e.GPUs) * (to - from))
	}
	return res, nil
}

// counts says whether pod i is in the figures: measured, and not censored.
func (e *Env) counts(i int) bool { return e.measured[i] && !e.Pods[i].Censored }

// quantile is the nearest-rank quantile of sorted values.
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
