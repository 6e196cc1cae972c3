package bench

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// IncubatingFeatures is the allocator kube-scheduler 1.37 picks by default
// (consumable capacity and binding conditions are beta and on).
var IncubatingFeatures = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	DeviceBindingAndStatus: true, ConsumableCapacity: true,
}

type classLister map[string]*resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(l))
	for _, c := range l {
		out = append(out, c)
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := l[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}

// GPUClass is the DeviceClass of deployments/static/deviceclasses.yaml.
func GPUClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: rewrite.DeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.prism.dev"`}}},
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

// Allocator runs one Allocate(ctx, node, claims) per node, as kube-scheduler's
// Filter does, for a plain claim and its rewritten form alternately on the
// same node, with a warm CEL cache (size 10, as in kube-scheduler).
func Allocator(ctx context.Context, o AllocatorOptions) ([]Row, error) {
	var rows []Row
	for _, n := range o.Sizes {
		f, err := NewMixedFleet(ctx, "", n, 8)
		if err != nil {
			return nil, err
		}
		cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: true})
		state := structured.AllocatedState{
			AllocatedDevices:         sets.New[structured.DeviceID](),
			AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
			AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
		}
		a, err := structured.NewAllocator(ctx, IncubatingFeatures, state, classLister{rewrite.DeviceClassName: GPUClass(), rewrite.TierDeviceClassName: TierClass()}, f.Slices, cache)
		if err != nil {
			return nil, err
		}
		for _, p := range Profiles {
			plain := claim(GPUSpec(1))
			spec, err := RewrittenSpec(ctx, 1, p.Profile)
			if err != nil {
				return nil, err
			}
			rewritten := claim(spec)
			r, err := allocatorCase(ctx, a, f, plain, rewritten, o.Passes)
			if err != nil {
				return nil, fmt.Errorf("%d nodes, %s: %w", n, p.Name, err)
			}
			cse := fmt.Sprintf("%d nodes, %s", n, p.Name)
			rows = append(rows,
				NewRow("allocator", cse, "mean per node", "µs", "plain", r.plainMean, "rewritten", r.rewrittenMean, r.fits),
				NewRow("allocator", cse, "worst node", "µs", "plain", r.plainWorst, "rewritten", r.rewrittenWorst,
					fmt.Sprintf("worst per-node ratio %.1fx on %s", r.worstRatio, r.worstRatioModel)))
		}
	}
	return rows, nil
}

func claim(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid-1"},
		Spec:       *spec,
	}
}

type allocatorResult struct {
	plainMean, rewrittenMean, plainWorst, rewrittenWorst, worstRatio float64
	worstRatioModel, fits                                            string
}

func allocatorCase(ctx context.Context, a structured.Allocator, f *Fleet, plain, rewritten *resourceapi.ResourceClaim, passes int) (allocatorResult, error) {
	var res allocatorResult
	fitsPlain, fitsRewritten := 0, 0
	run := func(node int, c *resourceapi.ResourceClaim) (time.Duration, bool, error) {
		start := time.Now()
		out, err := a.Allocate(ctx, f.Nodes[node], []*resourceapi.ResourceClaim{c})
		return time.Since(start), len(out) == 1, err
	}
	for n := range f.Nodes { // warm the CEL cache
		if _, ok, err := run(n, plain); err != nil {
			return res, err
		} else if ok {
			fitsPlain++
		}
		if _, ok, err := run(n, rewritten); err != nil {
			return res, err
		} else if ok {
			fitsRewritten++
		}
	}
	plainNs := make([][]time.Duration, len(f.Nodes))
	rewrittenNs := make([][]time.Duration, len(f.Nodes))
	for range passes {
		for n := range f.Nodes {
			d, _, _ := run(n, plain)
			plainNs[n] = append(plainNs[n], d)
			d, _, _ = run(n, rewritten)
			rewrittenNs[n] = append(rewrittenNs[n], d)
		}
	}
	// Per-node medians: a GC pause or a preemption inside one call must
	// not decide which node is the worst.
	var plainSum, sum float64
	for n := range f.Nodes {
		p, r := us(Median(plainNs[n])), us(Median(rewrittenNs[n]))
		plainSum += p
		sum += r
		res.plainWorst = max(res.plainWorst, p)
		res.rewrittenWorst = max(res.rewrittenWorst, r)
		if r/p > res.worstRatio {
			res.worstRatio, res.worstRatioModel = r/p, f.Model[n]
		}
	}
	nodes := float64(len(f.Nodes))
	res.plainMean, res.rewrittenMean = plainSum/nodes, sum/nodes
	res.fits = fmt.Sprintf("fits on %d / %d nodes (plain %d); %d passes", fitsRewritten, len(f.Nodes), fitsPlain, passes)
	return res, nil
}
