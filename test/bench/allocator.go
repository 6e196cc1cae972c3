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
	"slices"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/deviceclasses"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// GPUClass is the DeviceClass of deployments/static/deviceclasses.yaml.
func GPUClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: rewrite.DeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + gpuv1alpha1.DriverName + `" && !has(device.attributes["` + gpuv1alpha1.DriverName + `"].` + string(gpuv1alpha1.MIGProfileAttribute) + `)`}}},
		},
	}
}

// TierClass is the DeviceClass of the subrequests the rewrite writes: no
// selectors (deployments/static/deviceclasses.yaml).
func TierClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: rewrite.TierDeviceClassName}}
}

// AllocatorOptions bound the allocator phase.
type AllocatorOptions struct {
	Sizes  []int // node counts, 8 GPUs each
	Passes int   // timed passes over every node; per-node medians
}

// allocatorClaim is one claim shape of the allocator phase.
type allocatorClaim struct {
	name  string
	claim *resourceapi.ResourceClaim
	// on is the allocator to run it on; nil: the phase's own.
	on structured.Allocator
	// skip are models whose nodes the claim's pod never reaches the
	// allocator on: its required node affinity excludes them, and
	// kube-scheduler's NodeAffinity Filter runs before DynamicResources.
	skip map[string]bool
	// fleet names the references measured on the same slices ("": the
	// phase's own); a claim of that fleet is compared with its plain and
	// selective claims, named "plain, "+fleet and "selective, "+fleet.
	fleet string
}

// references are the names of the plain and the selective claim a claim is
// compared with.
func (c allocatorClaim) references() (plain, selective string) {
	if c.fleet == "" {
		return "plain", "selective"
	}
	return "plain, " + c.fleet, "selective, " + c.fleet
}

// Allocator runs one Allocate(ctx, node, claims) per node, as kube-scheduler's
// Filter does, with a warm CEL cache (size 10, as in kube-scheduler). Per
// profile it times, alternately on each node so that machine noise hits all
// alike: the plain claim; the hand-written selective claim (the preference a
// user would write without Prism); the ladder the webhook writes (cut from
// the published fleet), also with every tier in gpu.prism.dev as before
// generated subrequests had their own class, and with the memory floor as a
// capacity request; the built-in ladder (no fleet known); and the claim of
// the affinity design, which carries only the hard needs.
func Allocator(ctx context.Context, o AllocatorOptions) ([]Row, error) {
	var rows []Row
	for i, n := range o.Sizes {
		f, err := NewMixedFleet(ctx, "", n, 8)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			act, err := ActivationCost(ctx, f, 5*o.Passes)
			if err != nil {
				return nil, fmt.Errorf("activation cost: %w", err)
			}
			rows = append(rows, act...)
		}
		a, err := newAllocator(ctx, f.Slices)
		if err != nil {
			return nil, err
		}
		// The same nodes as published by a plugin with --figures-as-capacity,
		// which capacity tier bounds need: each device has three capacities
		// more, which every CEL evaluation on it builds.
		withFigures, err := NewMixedFleetWithFigureCapacities(ctx, "", n, 8)
		if err != nil {
			return nil, err
		}
		aFigures, err := newAllocator(ctx, withFigures.Slices)
		if err != nil {
			return nil, err
		}
		published := rewrite.WithFleet(f.Published())
		publishedFigures := rewrite.WithFleet(withFigures.Published())
		for _, p := range Profiles {
			ladder, err := RewrittenSpec(ctx, 1, p.Profile, published)
			if err != nil {
				return nil, err
			}
			capacity, err := RewrittenSpec(ctx, 1, p.Profile, published, rewrite.MemoryFloorAsCapacity())
			if err != nil {
				return nil, err
			}
			bounds, err := RewrittenSpec(ctx, 1, p.Profile, publishedFigures, rewrite.MemoryFloorAsCapacity(), rewrite.TierBoundsAsCapacity())
			if err != nil {
				return nil, err
			}
			// What the controller writes in affinity mode by default.
			affinityForms, err := RewrittenSpec(ctx, 1, p.Profile, publishedFigures, rewrite.WithPreference(rewrite.PreferAffinity), rewrite.MemoryFloorAsCapacity(), rewrite.TierBoundsAsCapacity())
			if err != nil {
				return nil, err
			}
			builtIn, err := RewrittenSpec(ctx, 1, p.Profile)
			if err != nil {
				return nil, err
			}
			// The affinity design: the claim carries the hard needs only,
			// the preference is on the pod (the allocator never sees it).
			affinity, err := RewrittenSpec(ctx, 1, p.Profile, published, rewrite.WithPreference(rewrite.PreferAffinity))
			if err != nil {
				return nil, err
			}
			affinityCapacity, err := RewrittenSpec(ctx, 1, p.Profile, published, rewrite.WithPreference(rewrite.PreferAffinity), rewrite.MemoryFloorAsCapacity())
			if err != nil {
				return nil, err
			}
			decision, err := rewrite.NodePreference(p.Profile, published, rewrite.WithPreference(rewrite.PreferAffinity))
			if err != nil {
				return nil, err
			}
			claims := []allocatorClaim{
				{name: "plain", claim: claim(sim.GPUClaim(1))},
				{name: "selective", claim: claim(SelectiveSpec(1))},
				{name: "ladder, class CEL", claim: claim(InUserClass(ladder))},
				{name: allocCELLadder, claim: claim(ladder)},
				{name: "ladder, capacity floor", claim: claim(capacity)},
				{name: "built-in ladder", claim: claim(builtIn)},
				{name: "affinity, hard needs", claim: claim(affinity)},
				{name: "affinity, capacity floor", claim: claim(affinityCapacity)},
				{name: "plain, " + figuresFleet, claim: claim(sim.GPUClaim(1)), on: aFigures, fleet: figuresFleet},
				{name: "selective, " + figuresFleet, claim: claim(SelectiveSpec(1)), on: aFigures, fleet: figuresFleet},
				{name: allocShippedLadder, claim: claim(bounds), on: aFigures, fleet: figuresFleet},
			}
			if decision.ExcludedNodes() != nil {
				skip := map[string]bool{}
				for _, m := range decision.Exclude {
					skip[m] = true
				}
				claims = append(claims, allocatorClaim{name: "affinity, unfit nodes excluded", claim: claim(affinity), skip: skip},
					allocatorClaim{name: "affinity, capacity forms, unfit nodes excluded", claim: claim(affinityForms), skip: skip, on: aFigures, fleet: figuresFleet})
			}
			r, err := allocatorCase(ctx, a, f, claims, o.Passes)
			if err != nil {
				return nil, fmt.Errorf("%d nodes, %s: %w", n, p.Name, err)
			}
			rows = append(rows, r.rows(fmt.Sprintf("%d nodes, %s", n, p.Name), o.Passes)...)
		}
		slim, err := slimRows(ctx, a, f, o.Passes)
		if err != nil {
			return nil, fmt.Errorf("%d nodes, slim fleet: %w", n, err)
		}
		rows = append(rows, slim...)
	}
	return rows, nil
}

// newAllocator is the allocator kube-scheduler 1.37 builds for a pod, with
// the chart's DeviceClasses and a warm-able CEL cache of its size (10).
func newAllocator(ctx context.Context, slices []*resourceapi.ResourceSlice) (structured.Allocator, error) {
	return newAllocatorWith(ctx, slices, deviceclasses.Of(GPUClass(), TierClass()), nil)
}

// newAllocatorWith is newAllocator with other DeviceClasses and with the
// allocated devices, whose counters the allocator takes as consumed.
func newAllocatorWith(ctx context.Context, slices []*resourceapi.ResourceSlice, classes deviceclasses.Static, allocated sets.Set[structured.DeviceID]) (structured.Allocator, error) {
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
	if allocated == nil {
		allocated = sets.New[structured.DeviceID]()
	}
	state := structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	return structured.NewAllocator(ctx, sim.Features, state, classes, slices, cache)
}

// slimRows compares the fleet as published with the same fleet publishing
// only ReadAttributes, for the plain claim and the first profile's ladder:
// what the attributes nothing in Prism reads cost the scheduler.
func slimRows(ctx context.Context, a structured.Allocator, f *Fleet, passes int) ([]Row, error) {
	slim, err := newAllocator(ctx, Slim(f.Slices))
	if err != nil {
		return nil, err
	}
	ladder, err := RewrittenSpec(ctx, 1, Profiles[0].Profile, rewrite.WithFleet(f.Published()))
	if err != nil {
		return nil, err
	}
	r, err := allocatorCase(ctx, a, f, []allocatorClaim{
		{name: "plain", claim: claim(sim.GPUClaim(1))},
		{name: "plain, slim", claim: claim(sim.GPUClaim(1)), on: slim},
		{name: "ladder", claim: claim(ladder)},
		{name: "ladder, slim", claim: claim(ladder), on: slim},
	}, passes)
	if err != nil {
		return nil, err
	}
	cse := fmt.Sprintf("%d nodes, %s, attributes", len(f.Nodes), Profiles[0].Name)
	note := fmt.Sprintf("slim: each device publishes only %d attributes, the ones generated selectors read", len(ReadAttributes))
	c := r.claims
	return []Row{
		NewRow("allocator", cse, "mean per node", "µs", "plain, all attributes", c[0].mean, "plain, slim", c[1].mean, note),
		NewRow("allocator", cse, "mean per node", "µs", "ladder, all attributes", c[2].mean, "ladder, slim", c[3].mean, note),
	}, nil
}

func claim(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid-1"},
		Spec:       *spec,
	}
}

// figuresFleet names the fleet published with --figures-as-capacity.
const figuresFleet = "figures as capacity"

// The allocator phase's ladders that the summary reads.
const (
	// allocShippedLadder is the ladder in ShippedForm, on figuresFleet,
	// published as the chart's plugin publishes it: what the controller
	// writes by default. It is compared with "plain, "+figuresFleet.
	allocShippedLadder = "ladder, capacity floor and bounds"
	// allocCELLadder is the ladder in the CEL form (--memory-floor=cel),
	// on the fleet without figure capacities.
	allocCELLadder = "ladder"
)

// claimCost is what one claim shape cost over the fleet.
type claimCost struct {
	name string
	// plain and selective are the names of its references.
	plain, selective string
	mean, worst      float64   // µs per node: mean of per-node medians, largest median
	perNode          []float64 // 0 on skipped nodes
	fits             int
	// skipped nodes are not in mean or fits (allocatorClaim.skip).
	skipped int
}

type allocatorResult struct {
	model  []string
	claims []claimCost // in the order given, plain first
}

func allocatorCase(ctx context.Context, a structured.Allocator, f *Fleet, claims []allocatorClaim, passes int) (allocatorResult, error) {
	res := allocatorResult{model: f.Model, claims: make([]claimCost, len(claims))}
	run := func(node int, c allocatorClaim) (time.Duration, bool, error) {
		on := a
		if c.on != nil {
			on = c.on
		}
		start := time.Now()
		out, err := on.Allocate(ctx, f.Nodes[node], []*resourceapi.ResourceClaim{c.claim})
		return time.Since(start), len(out) == 1, err
	}
	for n := range f.Nodes { // warm the CEL cache
		for i, c := range claims {
			if c.skip[f.Model[n]] {
				continue
			}
			_, ok, err := run(n, c)
			if err != nil {
				return res, fmt.Errorf("%s: %w", c.name, err)
			}
			if ok {
				res.claims[i].fits++
			}
		}
	}
	ns := make([][][]time.Duration, len(claims))
	for i := range ns {
		ns[i] = make([][]time.Duration, len(f.Nodes))
	}
	for range passes {
		for n := range f.Nodes {
			for i, c := range claims {
				if c.skip[f.Model[n]] {
					continue
				}
				d, _, _ := run(n, c)
				ns[i][n] = append(ns[i][n], d)
			}
		}
	}
	// Per-node medians: a GC pause or a preemption inside one call must
	// not decide which node is the worst.
	for i, c := range claims {
		cc := &res.claims[i]
		cc.name = c.name
		cc.plain, cc.selective = c.references()
		var sum float64
		for n := range f.Nodes {
			if c.skip[f.Model[n]] {
				cc.perNode = append(cc.perNode, 0)
				cc.skipped++
				continue
			}
			v := us(Median(ns[i][n]))
			cc.perNode = append(cc.perNode, v)
			sum += v
			cc.worst = max(cc.worst, v)
		}
		cc.mean = sum / float64(len(f.Nodes)-cc.skipped)
	}
	return res, nil
}

// worstRatio is the largest per-node ratio of b to a, and the model of
// that node.
func (r allocatorResult) worstRatio(a, b claimCost) (float64, string) {
	var worst float64
	model := ""
	for n := range a.perNode {
		if x := b.perNode[n] / a.perNode[n]; x > worst {
			worst, model = x, r.model[n]
		}
	}
	return worst, model
}

// rows compares each claim with plain, and the ladders with the
// hand-written selective claim, the fair reference: it is what a user
// writes to get the same preference without Prism.
func (r allocatorResult) rows(cse string, passes int) []Row {
	byName := map[string]claimCost{}
	for _, c := range r.claims {
		byName[c.name] = c
	}
	skipped := func(c claimCost) string {
		if c.skipped == 0 {
			return ""
		}
		return fmt.Sprintf("; mean over the %d nodes the allocator runs on: NodeAffinity rejects the other %d first", len(r.model)-c.skipped, c.skipped)
	}
	var out []Row
	for _, c := range r.claims {
		plain := byName[c.plain]
		if c.name == c.plain {
			continue
		}
		worst, model := r.worstRatio(plain, c)
		out = append(out, NewRow("allocator", cse, "mean per node", "µs", plain.name, plain.mean, c.name, c.mean,
			fmt.Sprintf("fits on %d / %d nodes (plain %d); %d passes%s; worst node %.0f µs, worst per-node ratio %.1fx on %s",
				c.fits, len(r.model), plain.fits, passes, skipped(c), c.worst, worst, model)))
	}
	for _, c := range r.claims {
		if c.name == c.plain || c.name == c.selective {
			continue
		}
		selective := byName[c.selective]
		out = append(out, NewRow("allocator", cse, "mean per node", "µs", selective.name, selective.mean, c.name, c.mean, "the fair reference: a preference written by hand ("+SelectiveSelector+")"+skipped(c)))
	}
	return out
}

// ReadAttributes are the device attributes that Prism's generated selectors
// read (pkg/rewrite's catalogue, built-in and fleet-cut tiers); the memory
// floor reads the memory capacity.
var ReadAttributes = []resourceapi.QualifiedName{
	gpuv1alpha1.BandwidthClassAttribute.Qualified(), gpuv1alpha1.MemoryBandwidthGBpsAttribute.Qualified(),
	gpuv1alpha1.FP32GFLOPSAttribute.Qualified(), gpuv1alpha1.CUDAComputeCapabilityAttribute.Qualified(),
}

// Slim keeps only ReadAttributes of every device: what a fleet would cost
// if the plugin published nothing else.
func Slim(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(in))
	for i, s := range in {
		out[i] = s.DeepCopy()
		for j := range out[i].Spec.Devices {
			d := &out[i].Spec.Devices[j]
			kept := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
			for _, name := range ReadAttributes {
				if a, ok := d.Attributes[name]; ok {
					kept[name] = a
				}
			}
			d.Attributes = kept
		}
	}
	return out
}

// ActivationCost times one evaluation of the class selector on a published
// device with its first k attributes (sorted by name), for k from 0 to all
// of them, and fits a line: the allocator builds the CEL activation from
// every attribute before the expression runs, so the slope is what each
// published attribute costs every evaluation in the cluster.
func ActivationCost(ctx context.Context, f *Fleet, samples int) ([]Row, error) {
	full := f.Slices[0].Spec.Devices[0]
	names := make([]resourceapi.QualifiedName, 0, len(full.Attributes))
	for name := range full.Attributes {
		names = append(names, name)
	}
	slices.Sort(names)
	prog := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true}).GetOrCompile(GPUClass().Spec.Selectors[0].CEL.Expression)
	if prog.Error != nil {
		return nil, prog.Error
	}
	eval := func(attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute) (float64, error) {
		d := cel.Device{Driver: gpuv1alpha1.DriverName, Attributes: attrs, Capacity: full.Capacity}
		const batch = 200
		var per []time.Duration
		for range samples {
			start := time.Now()
			for range batch {
				if _, _, err := prog.DeviceMatches(ctx, d); err != nil {
					return 0, err
				}
			}
			per = append(per, time.Since(start)/batch)
		}
		return us(Median(per)), nil
	}
	var xs, ys []float64
	for k := 0; k <= len(names); k++ {
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		for _, name := range names[:k] {
			attrs[name] = full.Attributes[name]
		}
		y, err := eval(attrs)
		if err != nil {
			return nil, err
		}
		xs, ys = append(xs, float64(k)), append(ys, y)
	}
	read := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	for _, name := range ReadAttributes {
		read[name] = full.Attributes[name]
	}
	readOnly, err := eval(read)
	if err != nil {
		return nil, err
	}
	slope, intercept := leastSquares(xs, ys)
	n := len(names)
	note := fmt.Sprintf("fit over k = 0..%d attributes: %.2f µs + %.3f µs per attribute; %d samples of 200 each", n, intercept, slope, samples)
	return []Row{
		NewRow("activation", "one class-selector evaluation, H100 device", "median", "µs", "no attributes", ys[0], fmt.Sprintf("all %d attributes", n), ys[n], note),
		NewRow("activation", "one class-selector evaluation, H100 device", "median", "µs", fmt.Sprintf("%d attributes selectors read", len(ReadAttributes)), readOnly, fmt.Sprintf("all %d attributes", n), ys[n], "what the attributes nothing in Prism reads cost each evaluation"),
	}, nil
}

func leastSquares(xs, ys []float64) (slope, intercept float64) {
	var sx, sy, sxx, sxy float64
	for i := range xs {
		sx += xs[i]
		sy += ys[i]
		sxx += xs[i] * xs[i]
		sxy += xs[i] * ys[i]
	}
	n := float64(len(xs))
	slope = (n*sxy - sx*sy) / (n*sxx - sx*sx)
	return slope, (sy - slope*sx) / n
}
