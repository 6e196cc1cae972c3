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

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/deviceclasses"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// migAllocProduct is the GPU of the mig-alloc phase's nodes: eight of them,
// in MIG mode on one node and not on the other.
const migAllocProduct = "NVIDIA H100 80GB HBM3"

// Node names of the mig-alloc phase.
const (
	migAllocPlainNode = "plain-0"
	migAllocMIGNode   = "mig-0"
)

// migAllocBusyGPUs are the GPUs of the busy MIG node that hold two 3g.40gb
// each, every memory slice of theirs: half the node's counters. They are
// the first ones because the allocator takes the first device that fits, in
// slice order, so a node fills from its first GPU.
var migAllocBusyGPUs = []int{0, 1, 2, 3}

// MIGAllocOptions bound the mig-alloc phase.
type MIGAllocOptions struct {
	// Rounds are the timed rounds; each runs every case once, in turn.
	Rounds int
}

// migClass is the chart's DeviceClass of partitions, rendered with the
// MIGPartitions gate (deployments/helm/prism/templates/deviceclasses.yaml).
func migClass() *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: rewrite.MIGDeviceClassName},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + gpuv1alpha1.DriverName + `" && has(device.attributes["` + gpuv1alpha1.DriverName + `"].` + string(gpuv1alpha1.MIGProfileAttribute) + `)`}}},
		},
	}
}

// tierClassWithMIG is rewrite.gpu.prism.dev as the chart renders it with
// the MIGPartitions gate: the rewrite's whole-GPU tiers leave partitions out.
func tierClassWithMIG() *resourceapi.DeviceClass {
	c := TierClass()
	c.Spec.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `!has(device.attributes["` + gpuv1alpha1.DriverName + `"].` + string(gpuv1alpha1.MIGProfileAttribute) + `)`}}}
	return c
}

// migClasses are the DeviceClasses of a cluster with the MIGPartitions gate.
func migClasses() deviceclasses.Static {
	return deviceclasses.Of(GPUClass(), tierClassWithMIG(), migClass())
}

// newMIGNode is one node of gpus GPUs of product, its ResourceSlices laid
// out as prism-kubelet-plugin publishes them with MIGPartitions on
// (gpu.ResourceSlices on the simulated NVML's discovery, with opts): in MIG
// mode, a slice of counter sets, a slice of the GPUs whole and one slice
// per GPU with its partitions; not in MIG mode, one slice of whole GPUs.
func newMIGNode(ctx context.Context, name, product string, gpus int, migMode bool, opts gpu.PublishOptions) (*Fleet, error) {
	spec, ok := gpu.LookupSpec(product)
	if !ok {
		return nil, fmt.Errorf("unknown product %q", product)
	}
	fake, err := nvml.NewSimulated(&nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []nvml.GPUGroup{{
		Product: product, Count: gpus, NUMANodes: min(2, gpus), NVLink: spec.NVLinks > 0, MIGMode: migMode,
	}}}, name)
	if err != nil {
		return nil, err
	}
	devices, err := nvml.Discover(ctx, fake, nvml.Options{})
	if err != nil {
		return nil, err
	}
	layout, err := gpu.ResourceSlices(ctx, devices, opts)
	if err != nil {
		return nil, err
	}
	content := make([]*resourceapi.ResourceSlice, len(layout))
	for i, s := range layout {
		content[i] = &resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: s.Devices, SharedCounters: s.SharedCounters}}
	}
	return &Fleet{Nodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: name}}}, Model: []string{product}, Slices: poolOf(name, content)}, nil
}

// poolOf names the slices of node's pool as the ResourceSlice controller
// does, by index, so that the allocator walks them in their order, and
// gives each the pool's slice count.
func poolOf(node string, slices []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	out := make([]*resourceapi.ResourceSlice, len(slices))
	for i, s := range slices {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%02d", node, gpuv1alpha1.DriverName, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         gpuv1alpha1.DriverName,
				NodeName:       ptr.To(node),
				Pool:           resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(slices))},
				Devices:        s.Spec.Devices,
				SharedCounters: s.Spec.SharedCounters,
			},
		}
	}
	return out
}

// migLightProfile is a profiled light job: a p95 duty cycle of 5 % and a
// 3Gi peak, which the rewrite sizes to the H100's 1g.20gb (docs/mig.md).
func migLightProfile() rewrite.Profile {
	peak := resource.MustParse("3Gi")
	return rewrite.Profile{
		Name: "light", BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: &peak,
		Usage: &prismv1alpha1.UsageProfile{
			DutyCycleP50MilliPercent: ptr.To(int32(2_500)), DutyCycleP95MilliPercent: ptr.To(int32(5_000)),
			PeakMemory: &peak, Runs: 3, Samples: 600,
		},
	}
}

// partitionSpec is a claim for one partition of the profile, in the class
// of partitions.
func partitionSpec(profile string) *resourceapi.ResourceClaimSpec {
	spec := sim.GPUClaim(1)
	spec.Devices.Requests[0].Exactly.DeviceClassName = rewrite.MIGDeviceClassName
	spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf("device.attributes[%q].%s == %q", gpuv1alpha1.DriverName, gpuv1alpha1.MIGProfileAttribute, profile),
	}}}
	return spec
}

// migAllocCase is one claim on one node, in one allocated state.
type migAllocCase struct {
	// state and name say what is measured: the node's state, the claim
	// and the node it runs on.
	state, name string
	on          structured.Allocator
	node        *v1.Node
	claim       *resourceapi.ResourceClaim
}

// migAllocIdle and migAllocBusy are the states of the MIG node.
const (
	migAllocIdle = "idle"
	migAllocBusy = "busy"
)

// migAllocReference is the case every other is compared with.
const migAllocReference = "plain claim, plain node"

// migRewriteProfiles are the H100's profiles that the rewrite's partition
// sizing can choose (pkg/rewrite's catalogue): neither "+me" nor the
// whole GPU as a partition.
var migRewriteProfiles = []string{"1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb"}

// migVariant is another way the MIG node could publish itself, timed
// beside the way it is published. opts is what the plugin can be told;
// reshape, where set, rewrites the published slices into what it does
// not publish, to measure an option before building it (busy: the node of
// the busy state).
type migVariant struct {
	name    string
	opts    gpu.PublishOptions
	reshape func(slices []*resourceapi.ResourceSlice, busy bool) []*resourceapi.ResourceSlice
}

// migVariants are the options of docs/mig.md's "What partitions cost the
// scheduler", each timed for a whole GPU and the light job's ladder on the
// idle and the busy node.
var migVariants = []migVariant{
	{name: "per-GPU slices", reshape: func(s []*resourceapi.ResourceSlice, _ bool) []*resourceapi.ResourceSlice { return perGPUSlices(s) }},
	{name: "rewrite's profiles", opts: gpu.PublishOptions{MIGProfiles: migRewriteProfiles}},
	{name: "1g.20gb and 3g.40gb only", opts: gpu.PublishOptions{MIGProfiles: []string{"1g.20gb", "3g.40gb"}}},
	{name: "slim partitions", reshape: func(s []*resourceapi.ResourceSlice, _ bool) []*resourceapi.ResourceSlice { return slimPartitions(s) }},
	{name: "free placements only", reshape: freePlacements},
}

// perGPUSlices is the layout before the GPUs in MIG mode got a slice of
// their own: each one whole, first in the slice of its partitions.
func perGPUSlices(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	whole := map[string]resourceapi.Device{}
	var out []*resourceapi.ResourceSlice
	for _, s := range in {
		if len(s.Spec.Devices) > 0 && partitionProfile(s.Spec.Devices[0]) == "" && len(s.Spec.Devices[0].ConsumesCounters) > 0 {
			for _, d := range s.Spec.Devices {
				whole[d.Name] = d
			}
			continue
		}
		c := s.DeepCopy()
		if len(c.Spec.Devices) > 0 && partitionProfile(c.Spec.Devices[0]) != "" {
			parent := c.Spec.Devices[0].ConsumesCounters[0].CounterSet
			c.Spec.Devices = append([]resourceapi.Device{whole[parent]}, c.Spec.Devices...)
		}
		out = append(out, c)
	}
	return poolOf(migAllocMIGNode, out)
}

// slimPartitions keeps of each partition only the attributes that say
// which one it is (profile, parent, product, index) and its memory.
func slimPartitions(in []*resourceapi.ResourceSlice) []*resourceapi.ResourceSlice {
	kept := []resourceapi.QualifiedName{gpuv1alpha1.MIGProfileAttribute.Qualified(), gpuv1alpha1.ParentUUIDAttribute.Qualified(),
		gpuv1alpha1.ProductNameAttribute.Qualified(), gpuv1alpha1.IndexAttribute.Qualified()}
	out := make([]*resourceapi.ResourceSlice, len(in))
	for i, s := range in {
		out[i] = s.DeepCopy()
		for j := range out[i].Spec.Devices {
			d := &out[i].Spec.Devices[j]
			if partitionProfile(*d) == "" {
				continue
			}
			attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
			for _, name := range kept {
				attrs[name] = d.Attributes[name]
			}
			d.Attributes = attrs
		}
	}
	return out
}

// freePlacements is what a plugin that republished its partitions from
// the instances it holds would publish: of each GPU with room, itself and
// the first placement of each profile; of a GPU that is full (the busy
// node's migAllocBusyGPUs), only the partitions allocated there.
func freePlacements(in []*resourceapi.ResourceSlice, busy bool) []*resourceapi.ResourceSlice {
	full := sets.New[string]()
	if busy {
		for _, i := range migAllocBusyGPUs {
			full.Insert(fmt.Sprintf("gpu-%d", i))
		}
	}
	held := migAllocBusyDevices()
	out := make([]*resourceapi.ResourceSlice, 0, len(in))
	for _, s := range in {
		c := s.DeepCopy()
		seen := sets.New[string]()
		c.Spec.Devices = slices.DeleteFunc(c.Spec.Devices, func(d resourceapi.Device) bool {
			if len(d.ConsumesCounters) == 0 {
				return false
			}
			parent, profile := d.ConsumesCounters[0].CounterSet, partitionProfile(d)
			if full.Has(parent) {
				return !held.Has(structured.MakeDeviceID(gpuv1alpha1.DriverName, migAllocMIGNode, d.Name))
			}
			first := !seen.Has(parent + "/" + profile)
			seen.Insert(parent + "/" + profile)
			return !first
		})
		if len(c.Spec.Devices) > 0 || len(c.Spec.SharedCounters) > 0 {
			out = append(out, c)
		}
	}
	return poolOf(migAllocMIGNode, out)
}

// partitionProfile is a device's MIG profile, "" for a whole GPU.
func partitionProfile(d resourceapi.Device) string {
	if a, ok := d.Attributes[gpuv1alpha1.MIGProfileAttribute.Qualified()]; ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

// migAllocBusyDevices are the partitions allocated on the busy node: two
// 3g.40gb on each of migAllocBusyGPUs.
func migAllocBusyDevices() sets.Set[structured.DeviceID] {
	out := sets.New[structured.DeviceID]()
	for _, i := range migAllocBusyGPUs {
		for _, first := range []int{0, 4} {
			out.Insert(structured.MakeDeviceID(gpuv1alpha1.DriverName, migAllocMIGNode, fmt.Sprintf("gpu-%d-mig-3g40gb-%d", i, first)))
		}
	}
	return out
}

// migAllocators are the allocators of the idle and the busy state, over
// the plain node and the MIG node's slices as variant publishes them.
func migAllocators(ctx context.Context, plain *Fleet, v migVariant, gpus int) (idle, busy structured.Allocator, err error) {
	mig, err := newMIGNode(ctx, migAllocMIGNode, migAllocProduct, gpus, true, v.opts)
	if err != nil {
		return nil, nil, err
	}
	held := migAllocBusyDevices()
	for _, state := range []string{migAllocIdle, migAllocBusy} {
		published := mig.Slices
		if v.reshape != nil {
			published = v.reshape(published, state == migAllocBusy)
		}
		for id := range held {
			if state == migAllocBusy && !publishes(published, id.Device.String()) {
				return nil, nil, fmt.Errorf("node %s (%q) publishes no partition %s", migAllocMIGNode, v.name, id.Device)
			}
		}
		all := append(append([]*resourceapi.ResourceSlice(nil), plain.Slices...), published...)
		allocated := held
		if state == migAllocIdle {
			allocated = nil
		}
		a, err := newAllocatorWith(ctx, all, migClasses(), allocated)
		if err != nil {
			return nil, nil, err
		}
		if state == migAllocIdle {
			idle = a
		} else {
			busy = a
		}
	}
	return idle, busy, nil
}

// migAllocCases builds a cluster of two nodes of gpus GPUs, one with its
// GPUs in MIG mode and one without, and the claims the phase times on
// them: a whole GPU on each, a 1g.10gb partition, and the ladder the
// webhook writes for a light job (cut from the published fleet, partitions
// offered), on the idle MIG node, on the same node with migAllocBusyGPUs
// cut, and the ladder on the plain node too; then, for each of
// migVariants, the whole GPU and the ladder on its idle and busy node.
func migAllocCases(ctx context.Context, gpus int) ([]migAllocCase, error) {
	plain, err := newMIGNode(ctx, migAllocPlainNode, migAllocProduct, gpus, false, gpu.PublishOptions{})
	if err != nil {
		return nil, err
	}
	mig, err := newMIGNode(ctx, migAllocMIGNode, migAllocProduct, gpus, true, gpu.PublishOptions{})
	if err != nil {
		return nil, err
	}
	cluster := &Fleet{Slices: append(append([]*resourceapi.ResourceSlice(nil), plain.Slices...), mig.Slices...)}
	ladder, plan, err := rewrite.Rewrite(ctx, sim.GPUClaim(1), migLightProfile(), rewrite.WithFleet(cluster.Published()), rewrite.PartitionsFromUsage())
	if err != nil {
		return nil, err
	}
	if plan.Partition == nil || plan.Partition.Verdict != rewrite.PartitionSized.String() {
		return nil, fmt.Errorf("the light job got no partition: %+v", plan.Partition)
	}
	idle, busy, err := migAllocators(ctx, plain, migVariant{}, gpus)
	if err != nil {
		return nil, err
	}
	whole, oneG, light := claim(sim.GPUClaim(1)), claim(partitionSpec("1g.10gb")), claim(ladder)
	plainNode, migNode := plain.Nodes[0], mig.Nodes[0]
	cases := []migAllocCase{
		{migAllocIdle, migAllocReference, idle, plainNode, whole},
		{migAllocIdle, "plain claim, MIG node", idle, migNode, whole},
		{migAllocIdle, "1g.10gb partition, MIG node", idle, migNode, oneG},
		{migAllocIdle, "light job's ladder, MIG node", idle, migNode, light},
		{migAllocIdle, "light job's ladder, plain node", idle, plainNode, light},
		{migAllocBusy, "plain claim, MIG node", busy, migNode, whole},
		{migAllocBusy, "1g.10gb partition, MIG node", busy, migNode, oneG},
		{migAllocBusy, "light job's ladder, MIG node", busy, migNode, light},
	}
	for _, v := range migVariants {
		idle, busy, err := migAllocators(ctx, plain, v, gpus)
		if err != nil {
			return nil, err
		}
		for _, c := range []migAllocCase{
			{migAllocIdle, "plain claim", idle, migNode, whole},
			{migAllocIdle, "light job's ladder", idle, migNode, light},
			{migAllocBusy, "plain claim", busy, migNode, whole},
			{migAllocBusy, "light job's ladder", busy, migNode, light},
		} {
			c.name = fmt.Sprintf("%s, MIG node: %s", c.name, v.name)
			cases = append(cases, c)
		}
	}
	return cases, nil
}

func publishes(slices []*resourceapi.ResourceSlice, device string) bool {
	for _, s := range slices {
		for _, d := range s.Spec.Devices {
			if d.Name == device {
				return true
			}
		}
	}
	return false
}

// allocate runs the case once: how long Allocate took and the subrequest
// and device it chose ("" where nothing fits).
func (c migAllocCase) allocate(ctx context.Context) (time.Duration, string, error) {
	start := time.Now()
	out, err := c.on.Allocate(ctx, c.node, []*resourceapi.ResourceClaim{c.claim})
	took := time.Since(start)
	if err != nil || len(out) != 1 || len(out[0].Devices.Results) != 1 {
		return took, "", err
	}
	r := out[0].Devices.Results[0]
	return took, r.Request + " → " + r.Device, nil
}

// migAllocCaseName names the phase's case for one state of the MIG node.
func migAllocCaseName(gpus int, state string) string {
	cse := fmt.Sprintf("1 node, %d× %s", gpus, migAllocProduct)
	if state == migAllocBusy {
		return cse + fmt.Sprintf(", MIG node with GPUs %d-%d cut in two 3g.40gb", migAllocBusyGPUs[0], migAllocBusyGPUs[len(migAllocBusyGPUs)-1])
	}
	return cse
}

// MIGAllocator times Allocate for one node, as kube-scheduler's Filter
// calls it, on an 8-GPU node in MIG mode, which publishes every partition
// of each GPU, against the same node not in MIG mode: each case of
// migAllocCases once per round, in turn, so that machine noise hits all
// alike, after one warm-up round that fills the CEL cache. Each row
// compares a case's median with the plain claim's on the plain node.
func MIGAllocator(ctx context.Context, o MIGAllocOptions) ([]Row, error) {
	if o.Rounds < 1 {
		return nil, fmt.Errorf("mig-alloc: %d rounds, want at least 1", o.Rounds)
	}
	const gpus = 8
	cases, err := migAllocCases(ctx, gpus)
	if err != nil {
		return nil, err
	}
	got := make([]string, len(cases))
	for i, c := range cases {
		if _, got[i], err = c.allocate(ctx); err != nil {
			return nil, fmt.Errorf("%s, %s: %w", c.state, c.name, err)
		}
	}
	took := make([][]time.Duration, len(cases))
	for range o.Rounds {
		for i, c := range cases {
			d, _, _ := c.allocate(ctx)
			took[i] = append(took[i], d)
		}
	}
	ref := us(Median(took[0]))
	var rows []Row
	for i := 1; i < len(cases); i++ {
		c := cases[i]
		allocated := got[i]
		if allocated == "" {
			allocated = "nothing fits"
		}
		note := fmt.Sprintf("%d rounds; p25–p75 %.0f–%.0f µs (reference %.0f–%.0f); allocates %s",
			o.Rounds, us(Percentile(took[i], 0.25)), us(Percentile(took[i], 0.75)), us(Percentile(took[0], 0.25)), us(Percentile(took[0], 0.75)), allocated)
		rows = append(rows, NewRow("mig allocator", migAllocCaseName(gpus, c.state), "median per node", "µs", migAllocReference, ref, c.name, us(Median(took[i])), note))
	}
	return rows, nil
}
