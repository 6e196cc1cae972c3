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
	"math/bits"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"

	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// MIGProfile is one MIG slice size as the sizing evaluation models it.
type MIGProfile struct {
	Name string
	// Compute is the compute slices it takes of the GPU's ComputeSlices.
	Compute int
	// MemSlices is the memory slices its placement covers, from Start.
	MemSlices int
	// MemMiB is the memory a job on it may use.
	MemMiB int64
	// SMs are its streaming multiprocessors, which the admission
	// controller's partition step weighs against the whole GPU's.
	SMs    int64
	Starts []int
}

// MIGModel is a GPU model's MIG geometry: its profiles, smallest first,
// the last being the whole GPU.
type MIGModel struct {
	ComputeSlices, MemorySlices int
	// SMs are the whole GPU's, as the kubelet plugin publishes them, in
	// MIG mode too: more than its largest profile's, as MIG leaves some
	// unused.
	SMs      int64
	Profiles []MIGProfile
}

// MIGModels are the GPU models the sizing evaluation can cut. A100-40GB's
// profiles, SMs, memory and placements are the ones the simulated NVML
// answers with (pkg/gpu/nvml/simulated_mig.go, after NVIDIA's MIG User
// Guide), less 1g.10gb, which slices.csv never measured; its 108 SMs are
// the A100's datasheet figure (pkg/gpu's spec table). A placement covers
// the memory slices [start, start+MemSlices); two instances fit on one GPU
// when their placements do not overlap. That is NVML's rule, so
// fragmentation is modelled: a 4g.20gb needs slices 0-3 free, whatever else
// is free. TestSlicingChoosesWhatProductionChooses checks these figures
// against what the kubelet plugin publishes.
var MIGModels = map[string]MIGModel{
	"a100-40gb": {ComputeSlices: 7, MemorySlices: 8, SMs: 108, Profiles: []MIGProfile{
		{Name: "1g.5gb", Compute: 1, MemSlices: 1, MemMiB: 4864, SMs: 14, Starts: []int{0, 1, 2, 3, 4, 5, 6}},
		{Name: "2g.10gb", Compute: 2, MemSlices: 2, MemMiB: 9856, SMs: 28, Starts: []int{0, 2, 4}},
		{Name: "3g.20gb", Compute: 3, MemSlices: 4, MemMiB: 19968, SMs: 42, Starts: []int{0, 4}},
		{Name: "4g.20gb", Compute: 4, MemSlices: 4, MemMiB: 19968, SMs: 56, Starts: []int{0}},
		{Name: "7g.40gb", Compute: 7, MemSlices: 8, MemMiB: 40192, SMs: 98, Starts: []int{0}},
	}},
}

// fleet is the model as prism-controller sees a cluster of it whose
// kubelet plugins publish exactly its profiles: what the partition step
// chooses from.
func (m MIGModel) fleet(gpu string) *rewrite.Fleet {
	f := &rewrite.Fleet{Models: []rewrite.Model{{Name: gpu, Multiprocessors: m.SMs}}}
	for _, p := range m.Profiles {
		f.Partitions = append(f.Partitions, rewrite.PartitionModel{Model: gpu, Profile: p.Name, Devices: len(p.Starts),
			MemoryBytes: p.MemMiB << 20, Multiprocessors: p.SMs})
	}
	return f
}

// SliceSpeedTarget is the oracle's bar: the smallest slice keeping a job at
// or above this fraction of its whole-GPU speed.
const SliceSpeedTarget = 0.8

// SlicePolicy decides the MIG slice a job of the sizing evaluation asks for.
type SlicePolicy string

// The sizing policies. Only SliceOracle reads slices.csv.
const (
	// SliceWhole gives every job the whole GPU (7g).
	SliceWhole SlicePolicy = "whole-gpu"
	// SliceMemory asks for the smallest slice whose memory holds the job's
	// measured memory: what a user sizing by memory alone would ask for.
	SliceMemory SlicePolicy = "by-memory"
	// SlicePrism sizes what a partition must hold with the admission
	// controller's rule (rewrite.SizePartition: peak × 1.2 + 512 MiB; SM
	// or DRAM activity plus headroom where the data has SM activity, p95
	// duty cycle + max(10, p95/3) per cent where not) and asks for the
	// partition its partition step would choose
	// (rewrite.Fleet.SmallestPartitions: the smallest whose memory and SMs
	// hold that, never the largest profile); a heavy job, or one no
	// smaller profile holds, keeps the whole GPU.
	SlicePrism SlicePolicy = "prism"
	// SliceOracle reads the judge's table: the smallest slice at or above
	// SliceSpeedTarget of the whole-GPU speed.
	SliceOracle SlicePolicy = "oracle"
)

// SlicePolicies is every sizing policy, in table order.
var SlicePolicies = []SlicePolicy{SliceWhole, SliceMemory, SlicePrism, SliceOracle}

// profiled policies read jobs.csv's measured figures, so noise applies.
func (p SlicePolicy) profiled() bool { return p == SliceMemory || p == SlicePrism }

// SlicingData is one GPU model's job types and the judge's slice speeds.
type SlicingData struct {
	GPU   string
	Model MIGModel
	Jobs  []MeasuredJob
	// fleet is Model as the admission controller sees it.
	fleet *rewrite.Fleet
	// chosen memoises smallest by its arguments: the partition step's
	// choice takes microseconds, and a sweep asks it millions of times
	// about some thousands of distinct shares and memories.
	chosen sync.Map
	// Clamped names the slice speeds on this GPU model read as 1 (see
	// SpeedTolerance).
	Clamped []string
	// speed[i][k] is job type i's speed on profile k, a fraction of the
	// whole GPU: 0 where the job did not fit in the slice's memory, NaN
	// where the slices file has no row (not measured), which no policy
	// chooses.
	speed [][]float64
}

// ForSlicing picks one GPU model's job types that have slice speeds. Every
// slice named must be a profile of the model.
func (m *Measured) ForSlicing(gpu string) (*SlicingData, error) {
	model, ok := MIGModels[gpu]
	if !ok {
		return nil, fmt.Errorf("no MIG model for gpu %q (models: %s)", gpu, strings.Join(SlicingGPUs(), ", "))
	}
	d := &SlicingData{GPU: gpu, Model: model, fleet: model.fleet(gpu)}
	index := map[string]int{}
	for _, s := range m.Slices {
		if s.GPU != gpu {
			continue
		}
		k := slices.IndexFunc(model.Profiles, func(p MIGProfile) bool { return p.Name == s.Slice })
		if k < 0 {
			return nil, fmt.Errorf("slices file line %d: slice %q is not a MIG profile of %s (%s)", s.Line, s.Slice, gpu, profileNames(model))
		}
		i, ok := index[s.Job]
		if !ok {
			j := slices.IndexFunc(m.Jobs, func(j MeasuredJob) bool { return j.Job == s.Job && j.GPU == gpu })
			if j < 0 {
				return nil, fmt.Errorf("slices file line %d: job %q on gpu %q has no row in the jobs file", s.Line, s.Job, gpu)
			}
			i = len(d.Jobs)
			index[s.Job] = i
			d.Jobs = append(d.Jobs, m.Jobs[j])
			row := make([]float64, len(model.Profiles))
			for k := range row {
				row[k] = math.NaN()
			}
			d.speed = append(d.speed, row)
		}
		d.speed[i][k] = s.Speed
		d.Clamped = append(d.Clamped, s.Clamped...)
	}
	if len(d.Jobs) == 0 {
		return nil, fmt.Errorf("no slice speed measured on gpu %q", gpu)
	}
	// The whole GPU is the unit of speed, measured or not.
	for i := range d.speed {
		d.speed[i][len(model.Profiles)-1] = 1
	}
	return d, nil
}

func profileNames(m MIGModel) string {
	names := make([]string, len(m.Profiles))
	for i, p := range m.Profiles {
		names[i] = p.Name
	}
	return strings.Join(names, ", ")
}

// SlicingGPUs lists the GPU models with a MIG model, sorted.
func SlicingGPUs() []string {
	var out []string
	for g := range MIGModels {
		out = append(out, g)
	}
	slices.Sort(out)
	return out
}

// whole is the index of the whole-GPU profile.
func (d *SlicingData) whole() int { return len(d.Model.Profiles) - 1 }

// Choose is the profile a policy asks for a job of type typ whose measured
// figures are scaled by factor (1 + noise). Only the oracle reads the
// judge's speeds. No policy chooses a profile the job was not measured on,
// since the judge could not rate it: where a policy's rule picks one, the
// job asks for the next larger profile it was measured on.
func (d *SlicingData) Choose(p SlicePolicy, typ int, factor float64) int {
	k, _ := d.choose(p, typ, factor)
	return k
}

// choose is Choose and, where the policy's rule picked a profile the job
// was not measured on, that profile (-1 otherwise).
func (d *SlicingData) choose(p SlicePolicy, typ int, factor float64) (k, unmeasured int) {
	j := d.Jobs[typ]
	rule := d.whole()
	switch p {
	case SliceMemory:
		if Known(j.MemMiB) {
			// Rounded up to a whole MiB, as every profile's memory is,
			// which changes no choice and bounds the memo.
			rule = d.smallest(0, int64(math.Ceil(j.MemMiB*factor))<<20)
		}
	case SlicePrism:
		if need := sizePartition(j, factor); need.Verdict == rewrite.PartitionSized {
			rule = d.smallest(need.ComputePercent, need.MemoryBytes)
		}
	case SliceOracle:
		for k, s := range d.speed[typ] {
			if s >= SliceSpeedTarget-1e-9 {
				return k, -1
			}
		}
	}
	// Profiles grow in memory and compute, so a larger one also covers
	// what the rule asked for.
	k = rule
	for k < d.whole() && math.IsNaN(d.speed[typ][k]) {
		k++
	}
	if k != rule {
		return k, rule
	}
	return k, -1
}

// Unmeasured lists, per job type in order, the profiles it has no speed
// for; empty where it has one for every profile.
func (d *SlicingData) Unmeasured() [][]string {
	out := make([][]string, len(d.Jobs))
	for i, row := range d.speed {
		for k, s := range row {
			if math.IsNaN(s) {
				out[i] = append(out[i], d.Model.Profiles[k].Name)
			}
		}
	}
	return out
}

// smallest is the profile the admission controller's partition step
// chooses for computePercent of the GPU and memory bytes, or the whole GPU
// where it chooses none. The evaluation thus judges the rule that ships,
// not a copy of it.
func (d *SlicingData) smallest(computePercent, memory int64) int {
	key := [2]int64{computePercent, memory}
	if k, ok := d.chosen.Load(key); ok {
		return k.(int)
	}
	k := d.whole()
	if names, _ := d.fleet.SmallestPartitions(computePercent, memory); len(names) > 0 {
		k = slices.IndexFunc(d.Model.Profiles, func(p MIGProfile) bool { return p.Name == names[0] })
	}
	d.chosen.Store(key, k)
	return k
}

// SliceRun is one simulation of the sizing evaluation.
type SliceRun = GridRun[SlicePolicy]

// SliceResult is what one run measured over the middle 60 % of arrivals.
type SliceResult struct {
	SliceRun
	// Goodput is the sum of running jobs' speeds (each a fraction of the
	// whole GPU) over the GPUs holding a job, time-averaged.
	Goodput float64
	// Below80 is the share of jobs whose speed while running fell below
	// 80 % of the whole GPU's; a job that ran out of memory counts.
	Below80 float64
	// Median and P99 slowdown: (finish − arrival) / work alone on a whole
	// GPU, waiting included; Late is the share above SliceLateSlowdown.
	Median, P99, Late float64
	// OOMs is out-of-memory starts per 1000 jobs.
	OOMs float64
	// Sevenths is the mean compute slices of the slice a job ran on.
	Sevenths float64
}

// The serving criterion of GPUS NEEDED: at most SliceLateShare of jobs
// slowed beyond SliceLateSlowdown, waiting included. Looser than packing's
// 1.25, because a slice slows a job by design: the question is how many
// GPUs keep nine jobs in ten within twice their whole-GPU time.
const (
	SliceLateSlowdown = 2.0
	SliceLateShare    = 0.10
)

type slicedJob struct {
	sj                 *streamJob
	idx, prof, gpu, at int
	remaining, speed   float64
}

// drawStream draws n jobs of types job types: work exponential with mean 1
// (seconds alone on a whole GPU), Poisson arrivals at rate, and a noise
// draw in [-1, 1] per job.
func drawStream(types, n int, rate float64, seed uint64) []streamJob {
	rng := rand.New(rand.NewPCG(seed, 0x737472))
	noise := rand.New(rand.NewPCG(seed, 0x6e6f6973))
	out := make([]streamJob, n)
	t := 0.0
	for i := range out {
		t += rng.ExpFloat64() / rate
		out[i] = streamJob{typ: rng.IntN(types), arrive: t, work: rng.ExpFloat64(), noise: 2*noise.Float64() - 1}
	}
	return out
}

// Simulate runs one configuration of the sizing evaluation.
func (d *SlicingData) Simulate(r SliceRun) SliceResult {
	return d.simulate(r, r.stream(len(d.Jobs)))
}

// simulate is event-driven like the packing simulation. Each GPU is cut as
// jobs come: a job takes a free placement of its profile on the fullest
// GPU where one is free (best fit), at the highest free start, which keeps
// slice 0 — the only start of 4g and 7g — free longest. A placement is
// given back when its job ends (instances are created and destroyed per
// job, as Prism's prepare and unprepare do). A job that asked for a slice
// the judge lists as did not fit (speed 0) ran out of memory: it fails at
// start and reruns on a whole GPU. Jobs that fit nowhere wait and are
// retried in arrival order after every event.
func (d *SlicingData) simulate(r SliceRun, jobs []streamJob) SliceResult {
	used := make([]uint8, r.GPUs) // bit s: memory slice s is taken
	var running, queue []*slicedJob
	rec := newStreamLog(jobs)
	sevenths := make([]int, len(jobs))
	var good, busy float64

	mask := func(j *slicedJob) uint8 { return placementMask(d.Model.Profiles[j.prof], j.at) }
	schedule := func(now float64) {
		kept := queue[:0]
		for _, j := range queue {
			if d.speed[j.sj.typ][j.prof] == 0 {
				// Did not fit: the start fails, and the job asks again for
				// the whole GPU.
				rec.oom(j.idx)
				j.prof = d.whole()
			}
			g, at := placeSlice(used, d.Model.Profiles[j.prof])
			if g < 0 {
				kept = append(kept, j)
				continue
			}
			j.gpu, j.at, j.speed = g, at, d.speed[j.sj.typ][j.prof]
			used[g] |= mask(j)
			rec.started[j.idx] = now
			sevenths[j.idx] = d.Model.Profiles[j.prof].Compute
			running = append(running, j)
		}
		queue = kept
	}

	next, now := 0, 0.0
	for next < len(jobs) || len(queue) > 0 || len(running) > 0 {
		dt, done := math.Inf(1), -1
		for k, j := range running {
			if t := j.remaining / j.speed; t < dt {
				dt, done = t, k
			}
		}
		arrival := next < len(jobs) && jobs[next].arrive-now <= dt
		if arrival {
			dt = jobs[next].arrive - now
		}
		from, to := rec.window(now, dt)
		for _, j := range running {
			j.remaining -= j.speed * dt
			if to > from {
				good += j.speed * (to - from)
			}
		}
		if to > from {
			busy += float64(busyGPUs(used)) * (to - from)
		}
		now += dt
		if arrival {
			sj := &jobs[next]
			queue = append(queue, &slicedJob{sj: sj, idx: next, remaining: sj.work,
				prof: d.Choose(r.Policy, sj.typ, 1+r.Noise*sj.noise)})
			next++
		} else {
			j := running[done]
			rec.finish[j.idx] = now
			used[j.gpu] &^= mask(j)
			running = slices.Delete(running, done, done+1)
		}
		schedule(now)
	}

	res := SliceResult{SliceRun: r, OOMs: rec.oomsPer1000()}
	var shares []float64
	shares, res.Median, res.P99 = rec.judge(
		func(i int, _, speed float64) bool { return rec.oomed[i] || speed < SliceSpeedTarget-1e-9 },
		func(_ int, slowdown, _ float64) bool { return slowdown > SliceLateSlowdown+1e-9 })
	res.Below80, res.Late = shares[0], shares[1]
	sev := 0
	for i := rec.lo; i < rec.hi; i++ {
		sev += sevenths[i]
	}
	res.Sevenths = float64(sev) / float64(rec.hi-rec.lo)
	if busy > 0 {
		res.Goodput = good / busy
	}
	return res
}

// placeSlice picks a free placement of p: on the fullest GPU where one is free
// (best fit, lowest index first), at the highest free start. used holds a
// bit per memory slice taken. It returns -1 when no GPU has one.
func placeSlice(used []uint8, p MIGProfile) (gpu, start int) {
	gpu, start = -1, -1
	most := -1
	for g, u := range used {
		n := bits.OnesCount8(u)
		if n <= most {
			continue
		}
		for i := len(p.Starts) - 1; i >= 0; i-- {
			if u&placementMask(p, p.Starts[i]) == 0 {
				gpu, start, most = g, p.Starts[i], n
				break
			}
		}
	}
	return gpu, start
}

// placementMask is the memory slices a placement of p at start covers.
func placementMask(p MIGProfile, start int) uint8 {
	return uint8((1<<p.MemSlices)-1) << start
}

func busyGPUs(used []uint8) int {
	n := 0
	for _, u := range used {
		if u != 0 {
			n++
		}
	}
	return n
}

// GPUsNeeded is the fewest GPUs that serve the stream of a run (its rate
// fixed by Load × GPUs) with at most SliceLateShare of its jobs slowed
// beyond SliceLateSlowdown; NaN when even 4 × GPUs do not.
func (d *SlicingData) GPUsNeeded(r SliceRun) float64 {
	return gpusNeeded(r, len(d.Jobs), SliceLateShare+1e-9, func(r SliceRun, jobs []streamJob) float64 { return d.simulate(r, jobs).Late })
}

// ParseSlicePolicy checks a sizing policy name.
func ParseSlicePolicy(s string) (SlicePolicy, error) {
	names := make([]string, len(SlicePolicies))
	for i, p := range SlicePolicies {
		if string(p) == s {
			return p, nil
		}
		names[i] = string(p)
	}
	return "", fmt.Errorf("unknown MIG sizing policy %q (want one of %s)", s, strings.Join(names, ", "))
}

// sizePartition is what the admission controller's rule,
// rewrite.SizePartition, asks a partition to hold for a job whose measured
// figures are scaled by factor: its utilisation read as both its p50 and
// p95 duty cycle (see SizeShare), its SM and DRAM activity where the data
// has them (the H100 rows; MISO's have none, so their partitions are sized
// from the duty cycle), its memory as the peak.
func sizePartition(j MeasuredJob, factor float64) rewrite.PartitionNeed {
	if !Known(j.UtilPct) || !Known(j.MemMiB) {
		return rewrite.PartitionNeed{Verdict: rewrite.PartitionNoUsage}
	}
	u := measuredUsage(j.UtilPct*factor, j.MemMiB*factor)
	if Known(j.SMPct) {
		u.SMActivityMilliPercent = ptr.To(milliPercent(j.SMPct * factor))
		if Known(j.DRAMPct) {
			u.DRAMActivityMilliPercent = ptr.To(milliPercent(j.DRAMPct * factor))
		}
	}
	// The data has no ncu figures.
	return rewrite.SizePartition(u, rewrite.KernelShape{})
}
