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
	"encoding/csv"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/deviceclasses"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Policy is how a pod's GPU claim is written, which decides the node
// preference the scheduler sees. Every policy runs through the same
// scheduler model (see schedule).
type Policy string

const (
	// Kube is the plain claim, the user's pinned model (gpu_spec) ignored.
	Kube Policy = "kube"
	// Blind is the plain claim restricted to the pinned models.
	Blind Policy = "blind"
	// FastestFree and PreferHBM are profile-free ladders: models ranked by
	// the published FP32 figure, or HBM before GDDR.
	FastestFree Policy = "fastest-free"
	PreferHBM   Policy = "prefer-hbm"
	// PrismPerformance and PrismEconomy are the claims rewrite.Rewrite
	// writes from the classifier's (noisy) bound type for the published
	// fleet, under the profile policy they are named after.
	PrismPerformance Policy = "prism-" + Policy(prismv1alpha1.PolicyPerformance)
	PrismEconomy     Policy = "prism-" + Policy(prismv1alpha1.PolicyEconomy)
	// PrismLoadAware is the load-aware policy: rewritten at the pod's
	// arrival from the free devices per model and the pending pods (with
	// their labels) at that moment.
	PrismLoadAware Policy = "prism-" + Policy(prismv1alpha1.PolicyLoadAware)
	// Oracle ranks models by the job's true measured throughput.
	Oracle Policy = "oracle"
)

// Policies is the order results are reported in.
var Policies = []Policy{Kube, Blind, FastestFree, PreferHBM, PrismPerformance, PrismEconomy, PrismLoadAware, Oracle}

// ParsePolicy accepts the names above. They are the simulator's ways of
// writing a claim, Prism's profile policies among them, so this is not
// prismv1alpha1.ParsePolicy.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	return "", fmt.Errorf("unknown policy %q (want one of %v)", s, Policies)
}

func (p Policy) prism() bool {
	return p == PrismPerformance || p == PrismEconomy || p == PrismLoadAware
}

// noFit marks a model a claim cannot use.
const noFit = -1

// tiers[m] is the rank of model m in a claim's preference (0 best), or
// noFit.
type tiers [numModels]int

// bounds are the classes the classifier can answer, which label noise
// draws from.
var bounds = []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.BoundTypeBalanced}

// Env is a fleet and a trace, and what Prism's production code makes of
// the fleet: the ladder each (policy, bound type) gets and the rank each
// model has in it.
type Env struct {
	Machines []Machine
	Pods     []*Pod
	GPUs     int
	// modelGPUs counts the fleet's GPUs per model.
	modelGPUs [numModels]int
	// Fleet is what the controller would see in the ResourceSlices.
	Fleet rewrite.Fleet
	// prism[policy][bound] are the ranks rewrite's ladder gives each model.
	prism map[prismv1alpha1.Policy]map[prismv1alpha1.BoundType]tiers
	// Ladders describes each ladder for the report: its subrequest names.
	Ladders map[string][]string
	// jobTypes are what pods are drawn from.
	jobTypes []JobType
	// Unplaceable counts pods no node of the fleet can hold even when
	// empty (too many GPUs, CPU or memory for any allowed model's nodes).
	Unplaceable int
	// offered is one copy of the trace's demand in GPU-seconds at observed
	// runtimes, arriving over span seconds.
	offered, span float64
	// measured says which pods count in the figures.
	measured []bool
	// ModelNames are the published product names.
	ModelNames [numModels]string
	devices    [numModels]resourceapi.Device
	// ctx serves the load-aware rewrites made during runs; ranked memoises
	// their model ranks per ladder, shared by parallel runs.
	ctx    context.Context
	mu     sync.Mutex
	ranked map[string]tiers
}

// NewEnv prepares a fleet and trace, whose pods take their job types from
// types (ReadJobTypes). The trace is replayed repeat times back to back,
// each copy shifted by the trace's arrival span, so that the load holds
// long enough for queues to reach a steady state; the first and the last
// copy are warm-up and drain and are left out of the figures when repeat
// is at least 3.
//
// Prism's ranks come from running the admission controller's
// rewrite.Rewrite against the fleet the plugin would publish, then
// Kubernetes' structured allocator on one device of each model: the
// subrequest it allocates is the model's rank.
func NewEnv(ctx context.Context, machines []Machine, pods []*Pod, repeat int, types []JobType) (*Env, error) {
	if len(types) == 0 {
		return nil, fmt.Errorf("no job types to draw pods from")
	}
	e := &Env{Machines: machines, jobTypes: types, prism: map[prismv1alpha1.Policy]map[prismv1alpha1.BoundType]tiers{}, Ladders: map[string][]string{}}
	for _, m := range machines {
		e.GPUs += m.GPUs
		e.modelGPUs[m.Model] += m.GPUs
	}
	var base []*Pod
	for _, p := range pods {
		if !slices.ContainsFunc(machines, func(m Machine) bool { return m.holds(p) }) {
			e.Unplaceable++
			continue
		}
		base = append(base, p)
		e.offered += float64(p.GPUs*min(p.Milli, 1000)) / 1000 * p.Runtime
		e.span = max(e.span, p.Arrival)
	}
	if len(base) == 0 {
		return nil, fmt.Errorf("no pod fits any node of the fleet")
	}
	repeat = max(repeat, 1)
	// One mean gap between copies, so the last arrival of a copy and the
	// first of the next are not simultaneous.
	period := e.span + e.span/float64(len(base))
	for r := range repeat {
		for _, p := range base {
			c := *p
			c.ID = len(e.Pods)
			c.Arrival += float64(r) * period
			e.Pods = append(e.Pods, &c)
			e.measured = append(e.measured, repeat < 3 || (r > 0 && r < repeat-1))
		}
	}
	e.span = period
	e.ctx, e.ranked = ctx, map[string]tiers{}
	for m := range numModels {
		d, err := publish(ctx, m)
		if err != nil {
			return nil, err
		}
		e.devices[m] = d
		e.ModelNames[m] = ptr.Deref(d.Attributes[gpuv1alpha1.ProductNameAttribute.Qualified()].StringValue, "")
		if e.modelGPUs[m] == 0 {
			continue
		}
		e.Fleet.Models = append(e.Fleet.Models, rewrite.Model{
			Name:          e.ModelNames[m],
			Devices:       e.modelGPUs[m],
			BandwidthGBps: ptr.Deref(d.Attributes[gpuv1alpha1.MemoryBandwidthGBpsAttribute.Qualified()].IntValue, 0),
			FP32GFLOPS:    ptr.Deref(d.Attributes[gpuv1alpha1.FP32GFLOPSAttribute.Qualified()].IntValue, 0),
		})
	}
	for _, pol := range []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy} {
		e.prism[pol] = map[prismv1alpha1.BoundType]tiers{}
		for _, b := range bounds {
			t, names, err := ladderTiers(ctx, e.devices, &e.Fleet, b, pol)
			if err != nil {
				return nil, fmt.Errorf("ladder for %s %s: %w", b, pol, err)
			}
			e.prism[pol][b] = t
			e.Ladders[fmt.Sprintf("%s/%s", pol, shortBound(b))] = names
		}
	}
	return e, nil
}

// Subsample keeps every k-th node of each (model, GPU count) group, and at
// least one of each: a smaller fleet of the same shape, so that the trace's
// modest demand fills it at a compression that keeps arrivals spread over
// more time than its long pods run.
func Subsample(machines []Machine, k int) []Machine {
	type group struct {
		m    ModelID
		gpus int
	}
	seen := map[group]int{}
	var out []Machine
	for _, m := range machines {
		g := group{m.Model, m.GPUs}
		if seen[g]%max(k, 1) == 0 {
			out = append(out, m)
		}
		seen[g]++
	}
	return out
}

func (m Machine) holds(p *Pod) bool {
	return p.Allowed&(1<<m.Model) != 0 && m.GPUs >= p.GPUs && m.CPU >= p.CPU && m.Memory >= p.Memory
}

// ladderTiers rewrites a one-GPU claim and asks the allocator which
// subrequest each model's device satisfies. The selectors test device
// attributes only, so a model's rank is the same for any GPU count.
func ladderTiers(ctx context.Context, devices [numModels]resourceapi.Device, fleet *rewrite.Fleet, b prismv1alpha1.BoundType, pol prismv1alpha1.Policy) (tiers, []string, error) {
	out, _, err := rewrite.Rewrite(ctx, GPUClaim(1), rewrite.Profile{Name: "sim", BoundType: b, Policy: pol}, rewrite.WithFleet(fleet))
	if err != nil {
		return tiers{}, nil, err
	}
	return rankModels(ctx, devices, out)
}

// GPUClaim is the claim spec a user writes for count GPUs of the class
// gpu.prism.dev, request "gpu": what the rewrite starts from.
func GPUClaim(count int64) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: rewrite.DeviceClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
		},
	}}}}
}

// rankModels allocates a one-GPU version of a rewritten claim on a node
// holding one device of each model and returns the subrequest index each
// model gets.
func rankModels(ctx context.Context, devices [numModels]resourceapi.Device, out *resourceapi.ResourceClaimSpec) (tiers, []string, error) {
	var t tiers
	out = out.DeepCopy()
	var names []string
	req := &out.Devices.Requests[0]
	if req.Exactly != nil {
		req.Exactly.Count = 1
	}
	for i := range req.FirstAvailable {
		req.FirstAvailable[i].Count = 1
		names = append(names, "gpu/"+req.FirstAvailable[i].Name)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "sim", Namespace: "sim", UID: "sim"}, Spec: *out}
	var rs []*resourceapi.ResourceSlice
	for m := range numModels {
		node := fmt.Sprintf("node-%s", m)
		rs = append(rs, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: gpuv1alpha1.DriverName, NodeName: ptr.To(node),
				Pool:    resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{devices[m]},
			},
		})
	}
	alloc, err := structured.NewAllocator(ctx, Features, structured.AllocatedState{
		AllocatedDevices:         sets.New[structured.DeviceID](),
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, classes(), rs, cel.NewCache(16, cel.Features{EnableConsumableCapacity: Features.ConsumableCapacity}))
	if err != nil {
		return t, nil, err
	}
	for m := range numModels {
		res, err := alloc.Allocate(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-%s", m)}}, []*resourceapi.ResourceClaim{claim})
		if err != nil {
			return t, nil, err
		}
		switch {
		case len(res) == 0:
			t[m] = noFit
		case names == nil:
			t[m] = 0
		default:
			t[m] = slices.Index(names, res[0].Devices.Results[0].Request)
			if t[m] < 0 {
				return t, nil, fmt.Errorf("allocated for unknown request %q", res[0].Devices.Results[0].Request)
			}
		}
	}
	return t, names, nil
}

// rewriteTiers is the claim the admission webhook writes for a pod of the
// given label and GPU count under policy, from the controller's view at
// that moment: the load (nil but for load-aware) and what the job type's
// finished runs measured (nil before any). Rankings are memoised per
// ladder.
func (e *Env) rewriteTiers(policy prismv1alpha1.Policy, label prismv1alpha1.BoundType, gpus int, load *rewrite.Load, usage *prismv1alpha1.UsageProfile) (tiers, error) {
	opts := []rewrite.Option{rewrite.WithFleet(&e.Fleet)}
	if load != nil {
		opts = append(opts, rewrite.WithLoad(load))
	}
	out, _, err := rewrite.Rewrite(e.ctx, GPUClaim(int64(gpus)), rewrite.Profile{Name: "sim", BoundType: label, Policy: policy, Usage: usage}, opts...)
	if err != nil {
		return tiers{}, err
	}
	var key strings.Builder
	for _, s := range out.Devices.Requests[0].FirstAvailable {
		key.WriteString(s.Name + "|")
		for _, sel := range s.Selectors {
			if sel.CEL != nil {
				key.WriteString(sel.CEL.Expression + "|")
			}
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if t, ok := e.ranked[key.String()]; ok {
		return t, nil
	}
	t, _, err := rankModels(e.ctx, e.devices, out)
	if err != nil {
		return t, err
	}
	e.ranked[key.String()] = t
	return t, nil
}

// Features are those of the allocator kube-scheduler 1.37 runs by default
// (the "incubating" implementation).
var Features = structured.Features{
	AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	DeviceBindingAndStatus: true, ConsumableCapacity: true,
}

// classes are the Helm chart's DeviceClasses as a fleet without MIG
// partitions sees them: the GPU class, without the chart's check that a
// device is no partition, and the tier class.
func classes() deviceclasses.Static {
	return deviceclasses.Of(&resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: rewrite.DeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + gpuv1alpha1.DriverName + `"`}}},
		},
	}, &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: rewrite.TierDeviceClassName}})
}

func shortBound(b prismv1alpha1.BoundType) string {
	switch b {
	case prismv1alpha1.BoundTypeMemoryBound:
		return "memory"
	case prismv1alpha1.BoundTypeComputeBound:
		return "compute"
	case prismv1alpha1.BoundTypeLatencyBound:
		return "latency"
	case prismv1alpha1.BoundTypeBalanced:
		return "balanced"
	}
	return "unknown"
}

func newCSVReader(r io.Reader) *csv.Reader {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	return cr
}
