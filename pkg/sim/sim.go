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

// Package sim is a discrete-event placement simulator. It replays a job
// trace against a simulated fleet and lets production code decide every
// placement: the admission controller's rewrite.Rewrite turns each job's
// claim into a firstAvailable ladder, and the scheduler's structured
// allocator allocates it against the ResourceSlices the kubelet plugin
// would publish. See docs/simulator.md.
package sim

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// Mode is how claims are written before the scheduler sees them.
type Mode string

const (
	// Blind submits the plain claim: any free GPU.
	Blind Mode = "blind"
	// Performance and Economy rewrite the claim from the job's profile
	// with that policy.
	Performance Mode = "performance"
	Economy     Mode = "economy"
)

// AllModes is the order results are reported in.
var AllModes = []Mode{Blind, Performance, Economy}

// ParseMode accepts the mode names.
func ParseMode(s string) (Mode, error) {
	for _, m := range AllModes {
		if string(m) == s {
			return m, nil
		}
	}
	return "", fmt.Errorf("unknown mode %q (want blind, performance or economy)", s)
}

// Features are those of the allocator kube-scheduler 1.37 runs by default
// (the "incubating" implementation).
var Features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	DeviceBindingAndStatus: true, ConsumableCapacity: true,
}

// Options tune a run.
type Options struct {
	// Seed breaks ties between equally good nodes, as kube-scheduler's
	// random choice among the top-scoring nodes does.
	Seed uint64
}

// Result is what one mode achieved. Times are seconds.
type Result struct {
	Mode Mode `json:"mode"`
	Jobs int  `json:"jobs"`
	// Unplaceable jobs ask for more GPUs than any node has; they are left
	// out of every figure.
	Unplaceable int     `json:"unplaceable"`
	MeanJCT     float64 `json:"meanJCTSeconds"`
	P99JCT      float64 `json:"p99JCTSeconds"`
	Makespan    float64 `json:"makespanSeconds"`
	Utilisation float64 `json:"gpuUtilisation"`
	MeanQueue   float64 `json:"meanQueueingDelaySeconds"`
	// MeanSpeed is the mean speed relative to the reference GPU.
	MeanSpeed float64 `json:"meanSpeedup"`
	// Requests counts the (sub)request each job was allocated for, e.g.
	// "gpu/ultra"; Placements counts bound type -> product of the
	// slowest allocated GPU.
	Requests      map[string]int `json:"requests"`
	Placements    map[string]int `json:"placements"`
	AllocateCalls int            `json:"allocateCalls"`
	// JCTs are all completion times, sorted.
	JCTs []float64 `json:"-"`
}

// Simulate runs the trace once per mode. The jobs are not modified.
func Simulate(ctx context.Context, cl *Cluster, jobs []*Job, modes []Mode, opts Options) ([]*Result, error) {
	var out []*Result
	for _, m := range modes {
		r, err := simulateMode(ctx, cl, jobs, m, opts)
		if err != nil {
			return nil, fmt.Errorf("mode %s: %w", m, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// class is the set of nodes of one template with the same number of free
// devices of each product; the allocator answers the same for all of them.
type class struct {
	tmpl  int
	free  int // free devices of each node in the class
	nodes []int
}

type claimKey struct {
	bound rewrite.BoundType
	gpus  int
}

type preparedClaim struct {
	claim *resourceapi.ResourceClaim
	// tiers are the subrequest names in order; nil for a plain request.
	tiers []string
	// answers[c] is the tier the claim gets on the nodes of class c,
	// noFit, or unasked.
	answers []int16
}

type running struct {
	job     *Job
	node    int
	devices []string
}

type state struct {
	ctx   context.Context
	cl    *Cluster
	mode  Mode
	rng   *rand.Rand
	alloc structured.Allocator
	used  sets.Set[structured.DeviceID]

	// freeKinds[n][k] is how many devices of kind k node n has free.
	freeKinds [][]int
	// base[t] is the index of template t's first class; stride[t][k] the
	// step of kind k in the mixed-radix class index.
	base    []int
	stride  [][]int
	classes []class
	nodeCls []int // class index per node
	nodePos []int // position in its class's node list
	maxGPUs int

	claims map[claimKey]*preparedClaim
	calls  int
}

// Answers memoised per class: the allocator's answer for a claim on a node
// depends only on the node's kind and how many devices of each product it
// has free, which is what a class index encodes.
const (
	unasked = -2
	noFit   = -1
)

func newState(ctx context.Context, cl *Cluster, mode Mode, opts Options) (*state, error) {
	s := &state{ctx: ctx, cl: cl, mode: mode, rng: rand.New(rand.NewPCG(opts.Seed, 0x73696d)), used: sets.New[structured.DeviceID](), claims: map[claimKey]*preparedClaim{}}
	alloc, err := structured.NewAllocator(ctx, Features, structured.AllocatedState{
		AllocatedDevices:         s.used,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, classes(), cl.Slices, cel.NewCache(64, cel.Features{EnableConsumableCapacity: Features.ConsumableCapacity}))
	if err != nil {
		return nil, err
	}
	s.alloc = alloc
	tmplIndex := map[*Template]int{}
	for ti, t := range cl.Templates {
		tmplIndex[t] = ti
		counts := make([]int, len(t.Kinds))
		for _, k := range t.Kind {
			counts[k]++
		}
		s.base = append(s.base, len(s.classes))
		stride := make([]int, len(counts))
		size := 1
		for k, c := range counts {
			stride[k] = size
			size *= c + 1
		}
		s.stride = append(s.stride, stride)
		for i := range size {
			free, rest := 0, i
			for _, c := range counts {
				free += rest % (c + 1)
				rest /= c + 1
			}
			s.classes = append(s.classes, class{tmpl: ti, free: free})
		}
		s.maxGPUs = max(s.maxGPUs, t.GPUs)
	}
	s.nodeCls = make([]int, len(cl.Nodes))
	s.nodePos = make([]int, len(cl.Nodes))
	s.freeKinds = make([][]int, len(cl.Nodes))
	for _, n := range cl.Nodes {
		ti := tmplIndex[n.Template]
		s.freeKinds[n.Index] = make([]int, len(n.Template.Kinds))
		for _, d := range n.Devices {
			s.freeKinds[n.Index][n.Template.Kind[d]]++
		}
		c := s.classOf(n.Index, ti)
		s.nodeCls[n.Index] = c
		s.nodePos[n.Index] = len(s.classes[c].nodes)
		s.classes[c].nodes = append(s.classes[c].nodes, n.Index)
	}
	return s, nil
}

func (s *state) classOf(node, tmpl int) int {
	c := s.base[tmpl]
	for k, f := range s.freeKinds[node] {
		c += f * s.stride[tmpl][k]
	}
	return c
}

// move re-files node after its free devices changed.
func (s *state) move(node int) {
	old := s.nodeCls[node]
	c := s.classOf(node, s.classes[old].tmpl)
	if c == old {
		return
	}
	list := s.classes[old].nodes
	p := s.nodePos[node]
	last := list[len(list)-1]
	list[p] = last
	s.nodePos[last] = p
	s.classes[old].nodes = list[:len(list)-1]
	s.nodeCls[node] = c
	s.nodePos[node] = len(s.classes[c].nodes)
	s.classes[c].nodes = append(s.classes[c].nodes, node)
}

// prepare builds the claim a job submits in this mode, once per distinct
// (bound type, GPU count).
func (s *state) prepare(j *Job) (claimKey, *preparedClaim, error) {
	key := claimKey{j.Bound, j.GPUs}
	if s.mode == Blind || j.Bound == rewrite.Balanced || j.Bound == rewrite.Unknown {
		// Rewrite leaves these untouched: one plain claim per count.
		key.bound = ""
	}
	if pc, ok := s.claims[key]; ok {
		return key, pc, nil
	}
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: rewrite.DeviceClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           int64(j.GPUs),
		},
	}}}}
	pc := &preparedClaim{answers: make([]int16, len(s.classes))}
	for i := range pc.answers {
		pc.answers[i] = unasked
	}
	if key.bound != "" {
		out, _, err := rewrite.Rewrite(s.ctx, spec, rewrite.Profile{Name: "sim-" + shortBound(j.Bound), BoundType: j.Bound, Policy: rewrite.Policy(s.mode)})
		if err != nil {
			return key, nil, err
		}
		spec = out
		for _, sub := range spec.Devices.Requests[0].FirstAvailable {
			pc.tiers = append(pc.tiers, "gpu/"+sub.Name)
		}
	}
	pc.claim = &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("job-%s-%d", key.bound, key.gpus), Namespace: "sim", UID: "sim"},
		Spec:       *spec,
	}
	s.claims[key] = pc
	return key, pc, nil
}

func (s *state) allocate(node int, pc *preparedClaim) (*resourceapi.AllocationResult, int, error) {
	s.calls++
	res, err := s.alloc.Allocate(s.ctx, s.cl.Nodes[node].Obj, []*resourceapi.ResourceClaim{pc.claim})
	if err != nil || len(res) == 0 {
		return nil, 0, err
	}
	tier := 0
	if pc.tiers != nil {
		tier = slices.Index(pc.tiers, res[0].Devices.Results[0].Request)
		if tier < 0 {
			return nil, 0, fmt.Errorf("allocated for unknown request %q", res[0].Devices.Results[0].Request)
		}
	}
	return &res[0], tier, nil
}

// place tries to start j now. Like kube-scheduler, it filters every node
// (once per class of identical nodes, and only the first time the claim
// meets the class), keeps the nodes where the best subrequest fits (the
// DRA plugin scores them highest), picks one of them at random, and
// allocates the claim there.
func (s *state) place(j *Job, pc *preparedClaim) (*running, string, error) {
	best := math.MaxInt
	var cands []int
	total := 0
	for ci := range s.classes {
		c := &s.classes[ci]
		if len(c.nodes) == 0 || c.free < j.GPUs {
			continue
		}
		if pc.answers[ci] == unasked {
			res, tier, err := s.allocate(c.nodes[0], pc)
			if err != nil {
				return nil, "", err
			}
			pc.answers[ci] = noFit
			if res != nil {
				pc.answers[ci] = int16(tier)
			}
		}
		tier := int(pc.answers[ci])
		if tier == noFit || tier > best {
			continue
		}
		if tier < best {
			best, cands, total = tier, cands[:0], 0
		}
		cands = append(cands, ci)
		total += len(c.nodes)
	}
	if len(cands) == 0 {
		return nil, "", nil
	}
	pick := s.rng.IntN(total)
	node := -1
	for _, ci := range cands {
		if pick < len(s.classes[ci].nodes) {
			node = s.classes[ci].nodes[pick]
			break
		}
		pick -= len(s.classes[ci].nodes)
	}
	res, tier, err := s.allocate(node, pc)
	if err != nil {
		return nil, "", err
	}
	if res == nil || tier != best {
		// The class approximation broke: nodes of one class must get the
		// same answer.
		return nil, "", fmt.Errorf("node %s answers differently from the others of its class", s.cl.Nodes[node].Obj.Name)
	}
	r := &running{job: j, node: node}
	for _, d := range res.Devices.Results {
		s.used.Insert(structured.MakeDeviceID(d.Driver, d.Pool, d.Device))
		r.devices = append(r.devices, d.Device)
		s.freeKinds[node][s.cl.Nodes[node].Template.Kind[d.Device]]--
	}
	s.move(node)
	return r, res.Devices.Results[0].Request, nil
}

func (s *state) release(r *running) {
	n := s.cl.Nodes[r.node]
	for _, d := range r.devices {
		s.used.Delete(structured.MakeDeviceID(rewrite.DriverName, n.Obj.Name, d))
		s.freeKinds[r.node][n.Template.Kind[d]]++
	}
	s.move(r.node)
}

type completion struct {
	t float64
	r *running
}

type completions []completion

func (h completions) Len() int { return len(h) }
func (h completions) Less(a, b int) bool {
	if h[a].t != h[b].t {
		return h[a].t < h[b].t
	}
	return h[a].r.job.ID < h[b].r.job.ID
}
func (h completions) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *completions) Push(x any)   { *h = append(*h, x.(completion)) }
func (h *completions) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func simulateMode(ctx context.Context, cl *Cluster, jobs []*Job, mode Mode, opts Options) (*Result, error) {
	s, err := newState(ctx, cl, mode, opts)
	if err != nil {
		return nil, err
	}
	res := &Result{Mode: mode, Requests: map[string]int{}, Placements: map[string]int{}}
	var pending []*Job
	for _, j := range jobs {
		if j.GPUs > s.maxGPUs {
			res.Unplaceable++
			continue
		}
		pending = append(pending, j)
	}
	res.Jobs = len(pending)
	if len(pending) == 0 {
		return res, nil
	}
	var (
		h        completions
		queue    []*Job
		free     = cl.GPUs
		now      float64
		busy     float64
		lastDone float64
		sumJCT   float64
		sumQueue float64
		sumSpeed float64
		// failed holds the claims that fit nowhere since the last
		// completion: free devices only shrink until the next one, so
		// they still fit nowhere.
		failed = map[claimKey]bool{}
	)
	tryStart := func(j *Job) (bool, error) {
		if j.GPUs > free {
			return false, nil
		}
		key, pc, err := s.prepare(j)
		if err != nil {
			return false, err
		}
		if failed[key] {
			return false, nil
		}
		r, request, err := s.place(j, pc)
		if err != nil {
			return false, err
		}
		if r == nil {
			failed[key] = true
			return false, nil
		}
		speed := math.Inf(1)
		slowest := ""
		for _, d := range r.devices {
			spec := cl.Nodes[r.node].Template.Specs[d]
			if v := Speed(j, spec); v < speed {
				speed, slowest = v, spec.Product
			}
		}
		run := j.Runtime / speed
		free -= j.GPUs
		busy += run * float64(j.GPUs)
		sumQueue += now - j.Arrival
		sumSpeed += speed
		res.Requests[request]++
		res.Placements[shortBound(j.Bound)+" -> "+slowest]++
		heap.Push(&h, completion{t: now + run, r: r})
		return true, nil
	}
	next := 0
	for next < len(pending) || h.Len() > 0 {
		if h.Len() > 0 && (next == len(pending) || h[0].t <= pending[next].Arrival) {
			// All completions at this instant, then one pass over the
			// queue in arrival order.
			now = h[0].t
			for h.Len() > 0 && h[0].t == now {
				c := heap.Pop(&h).(completion)
				s.release(c.r)
				free += c.r.job.GPUs
				jct := now - c.r.job.Arrival
				sumJCT += jct
				res.JCTs = append(res.JCTs, jct)
				lastDone = now
			}
			clear(failed)
			kept := queue[:0]
			for i, j := range queue {
				if free == 0 {
					kept = append(kept, queue[i:]...)
					break
				}
				ok, err := tryStart(j)
				if err != nil {
					return nil, err
				}
				if !ok {
					kept = append(kept, j)
				}
			}
			clear(queue[len(kept):])
			queue = kept
			continue
		}
		j := pending[next]
		next++
		now = j.Arrival
		ok, err := tryStart(j)
		if err != nil {
			return nil, err
		}
		if !ok {
			queue = append(queue, j)
		}
	}
	if len(queue) > 0 {
		return nil, fmt.Errorf("%d jobs never started", len(queue))
	}
	n := float64(res.Jobs)
	slices.Sort(res.JCTs)
	res.MeanJCT = sumJCT / n
	res.P99JCT = res.JCTs[int(math.Ceil(0.99*n))-1]
	res.Makespan = lastDone - pending[0].Arrival
	if res.Makespan > 0 {
		res.Utilisation = busy / (float64(cl.GPUs) * res.Makespan)
	}
	res.MeanQueue = sumQueue / n
	res.MeanSpeed = sumSpeed / n
	res.AllocateCalls = s.calls
	return res, nil
}

func classes() deviceClasses {
	return deviceClasses{&resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: rewrite.DeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + rewrite.DriverName + `"`}}},
		},
	}, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: rewrite.TierDeviceClassName}}}
}

// deviceClasses is the DeviceClass the Helm chart installs for GPUs.
type deviceClasses []*resourceapi.DeviceClass

func (l deviceClasses) List() ([]*resourceapi.DeviceClass, error) { return l, nil }

func (l deviceClasses) Get(name string) (*resourceapi.DeviceClass, error) {
	for _, c := range l {
		if c.Name == name {
			return c, nil
		}
	}
	return nil, fmt.Errorf("device class %s not found", name)
}
