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

// Package bench measures Prism end to end on the local test bed: the
// structured allocator in process, kube-scheduler throughput, the kubelet
// plugin's NodePrepareResources over its real gRPC socket, the admission
// webhook over TLS, and the processes' footprint. Every result is a Row that
// compares two things measured in the same run; cmd/prism-bench prints them
// as one table and writes them as JSON.
package bench

import (
	"context"
	"fmt"
	"strings"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// MixedModels is the fleet mix: equal parts of each product.
var MixedModels = fleettest.MixedModels

// Fleet is a set of nodes with one ResourceSlice each.
type Fleet struct {
	Nodes  []*v1.Node
	Model  []string
	Slices []*resourceapi.ResourceSlice
}

// NewMixedFleet builds n nodes (n/4 of each MixedModels product) with gpus
// GPUs each, their slices exactly as prism-kubelet-plugin publishes them
// (through the simulator's use of gpu.ResourceDevices), named
// <prefix><group>-<i>.
func NewMixedFleet(ctx context.Context, prefix string, n, gpus int) (*Fleet, error) {
	return newMixedFleet(ctx, prefix, n, gpus, false)
}

// NewMixedFleetWithFigureCapacities is NewMixedFleet as published by a
// plugin with --figures-as-capacity, the cluster capacity tier bounds need.
func NewMixedFleetWithFigureCapacities(ctx context.Context, prefix string, n, gpus int) (*Fleet, error) {
	return newMixedFleet(ctx, prefix, n, gpus, true)
}

func newMixedFleet(ctx context.Context, prefix string, n, gpus int, figures bool) (*Fleet, error) {
	cl, err := sim.BuildCluster(ctx, fleettest.MixedFleet(prefix, n, gpus, figures))
	if err != nil {
		return nil, err
	}
	f := &Fleet{Slices: cl.Slices}
	for _, node := range cl.Nodes {
		f.Nodes = append(f.Nodes, node.Obj)
		f.Model = append(f.Model, MixedModels[groupIndex(node.Template.Name, prefix)])
	}
	return f, nil
}

// Published is the fleet prism-controller's informer would see for these
// slices: the webhook cuts every claim's ladder from it.
func (f *Fleet) Published() *rewrite.Fleet {
	v := fleet.NewView()
	for _, s := range f.Slices {
		s = s.DeepCopy()
		if s.UID == "" { // built in memory, never stored
			s.UID = types.UID(s.Name)
		}
		v.OnAdd(s, false)
	}
	return v.Fleet()
}

func groupIndex(group, prefix string) int {
	var i int
	fmt.Sscanf(strings.TrimPrefix(group, prefix), "g%d", &i)
	return i
}

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Profiles are the workload profiles of pkg/rewrite's BenchmarkAllocator:
// each ladder once; the 20Gi variants need 39Gi, so L4 nodes reject them.
var Profiles = []struct {
	Name    string
	Profile rewrite.Profile
}{
	{"MemoryBound-performance", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")}},
	{"MemoryBound-performance-20Gi", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("20Gi")}},
	{"MemoryBound-economy", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("16Gi")}},
	{"ComputeBound-performance", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")}},
	{"ComputeBound-economy-20Gi-cc8.0", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("20Gi"), MinComputeCapability: "8.0"}},
	{"LatencyBound-performance", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("8Gi")}},
	{"LatencyBound-economy", rewrite.Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("8Gi")}},
}

// RewrittenSpec is sim.GPUClaim(count) after Rewrite with the profile, what the
// mutating webhook stores.
func RewrittenSpec(ctx context.Context, count int64, p rewrite.Profile, opts ...rewrite.Option) (*resourceapi.ResourceClaimSpec, error) {
	spec, _, err := rewrite.Rewrite(ctx, sim.GPUClaim(count), p, opts...)
	return spec, err
}

// SelectiveSelector is the preference a user writes by hand without Prism:
// the fastest memory, on the class gpu.prism.dev. Every Prism GPU publishes
// bandwidthClass when its bandwidth is known, so a user would not guard it.
const SelectiveSelector = `device.attributes["gpu.prism.dev"].bandwidthClass == "ultra"`

// SelectiveSpec is sim.GPUClaim(count) with SelectiveSelector: the fair
// reference for the ladder's cost, since it expresses a preference too.
func SelectiveSpec(count int64) *resourceapi.ResourceClaimSpec {
	spec := sim.GPUClaim(count)
	spec.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: SelectiveSelector}}}
	return spec
}

// InUserClass is a rewritten spec with every subrequest in gpu.prism.dev,
// the design before generated subrequests got a class without selectors:
// it shows what the class selector costs.
func InUserClass(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaimSpec {
	out := spec.DeepCopy()
	for i := range out.Devices.Requests {
		for j := range out.Devices.Requests[i].FirstAvailable {
			out.Devices.Requests[i].FirstAvailable[j].DeviceClassName = rewrite.DeviceClassName
		}
	}
	return out
}
