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
	"github.com/prismgpu/prism/pkg/deviceclasses"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/pkg/sim"
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
// (gpu.ResourceSlices on the simulated NVML's discovery): in MIG mode, a
// slice of counter sets and one slice per GPU with the whole GPU and every
// partition; not in MIG mode, one slice of whole GPUs.
func newMIGNode(ctx context.Context, name, product string, gpus int, migMode bool) (*Fleet, error) {
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
	layout, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{})
	if err != nil {
		return nil, err
	}
	f := &Fleet{Nodes: []*v1.Node{{ObjectMeta: metav1.ObjectMeta{Name: name}}}, Model: []string{product}}
	for i, s := range layout {
		f.Slices = append(f.Slices, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", name, gpuv1alpha1.DriverName, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         gpuv1alpha1.DriverName,
				NodeName:       ptr.To(name),
				Pool:           resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: int64(len(layout))},
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		})
	}
	return f, nil
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

// migAllocCases builds a cluster of two nodes of gpus GPUs, one with its
// GPUs in MIG mode and one without, and the claims the phase times on
// them: a whole GPU on each, a 1g.10gb partition, and the ladder the
// webhook writes for a light job (cut from the published fleet, partitions
// offered), on the idle MIG node, on the same node with migAllocBusyGPUs
// cut, and the ladder on the plain node too.
func migAllocCases(ctx context.Context, gpus int) ([]migAllocCase, error) {
	plain, err := newMIGNode(ctx, migAllocPlainNode, migAllocProduct, gpus, false)
	if err != nil {
		return nil, err
	}
	mig, err := newMIGNode(ctx, migAllocMIGNode, migAllocProduct, gpus, true)
	if err != nil {
		return nil, err
	}
	slices := append(append([]*resourceapi.ResourceSlice(nil), plain.Slices...), mig.Slices...)
	cluster := &Fleet{Slices: slices}
	ladder, plan, err := rewrite.Rewrite(ctx, sim.GPUClaim(1), migLightProfile(), rewrite.WithFleet(cluster.Published()), rewrite.PartitionsFromUsage())
	if err != nil {
		return nil, err
	}
	if plan.Partition == nil || plan.Partition.Verdict != rewrite.PartitionSized.String() {
		return nil, fmt.Errorf("the light job got no partition: %+v", plan.Partition)
	}
	idle, err := newAllocatorWith(ctx, slices, migClasses(), nil)
	if err != nil {
		return nil, err
	}
	busyDevices := sets.New[structured.DeviceID]()
	for _, i := range migAllocBusyGPUs {
		for _, first := range []int{0, 4} {
			name := fmt.Sprintf("gpu-%d-mig-3g40gb-%d", i, first)
			if !publishes(mig.Slices, name) {
				return nil, fmt.Errorf("node %s publishes no partition %s", migAllocMIGNode, name)
			}
			busyDevices.Insert(structured.MakeDeviceID(gpuv1alpha1.DriverName, migAllocMIGNode, name))
		}
	}
	busy, err := newAllocatorWith(ctx, slices, migClasses(), busyDevices)
	if err != nil {
		return nil, err
	}
	whole, oneG, light := claim(sim.GPUClaim(1)), claim(partitionSpec("1g.10gb")), claim(ladder)
	plainNode, migNode := plain.Nodes[0], mig.Nodes[0]
	return []migAllocCase{
		{migAllocIdle, migAllocReference, idle, plainNode, whole},
		{migAllocIdle, "plain claim, MIG node", idle, migNode, whole},
		{migAllocIdle, "1g.10gb partition, MIG node", idle, migNode, oneG},
		{migAllocIdle, "light job's ladder, MIG node", idle, migNode, light},
		{migAllocIdle, "light job's ladder, plain node", idle, plainNode, light},
		{migAllocBusy, "plain claim, MIG node", busy, migNode, whole},
		{migAllocBusy, "1g.10gb partition, MIG node", busy, migNode, oneG},
		{migAllocBusy, "light job's ladder, MIG node", busy, migNode, light},
	}, nil
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
