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

package rewrite

import (
	"context"
	"slices"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// benchProfiles cover each ladder once on the mixed fleet; "20Gi" variants
// need 39Gi, so the L4 nodes reject the claim entirely.
var benchProfiles = []struct {
	name    string
	profile Profile
}{
	{"MemoryBound-performance", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")}},
	{"MemoryBound-performance-20Gi", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("20Gi")}},
	{"MemoryBound-economy", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("16Gi")}},
	{"ComputeBound-performance", Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")}},
	{"ComputeBound-economy-20Gi-cc8.0", Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("20Gi"), MinComputeCapability: "8.0"}},
	{"LatencyBound-performance", Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("8Gi")}},
	{"LatencyBound-economy", Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("8Gi")}},
}

// BenchmarkAllocator measures what kube-scheduler's Filter pays per node:
// one Allocate(ctx, node, claims) call, warm CEL cache, 500 nodes x 8 GPUs
// of equal parts H100, A100-80GB, L40S and L4. Plain and rewritten claims
// are timed alternately on the same node so that machine noise hits both.
func BenchmarkAllocator(b *testing.B) {
	f := newFleet(b, "H100", 125, 8, "A100-80", 125, 8, "L40S", 125, 8, "L4", 125, 8)
	for _, impl := range []struct {
		name     string
		features structured.Features
	}{{"incubating", incubatingFeatures}, {"stable", stableFeatures}} {
		a, _ := f.allocator(b, impl.features, nil)
		for _, bp := range benchProfiles {
			b.Run(impl.name+"/"+bp.name, func(b *testing.B) {
				plain := claimFor(gpuSpec(exactGPU("gpu", 1)))
				spec, _, err := Rewrite(context.Background(), &plain.Spec, bp.profile)
				if err != nil {
					b.Fatal(err)
				}
				rewritten := claimFor(spec)
				benchmarkNodes(b, a, f, plain, rewritten)
			})
		}
	}
}

func benchmarkNodes(b *testing.B, a structured.Allocator, f *fleet, plain, rewritten *resourceapi.ResourceClaim) {
	ctx := context.Background()
	run := func(node int, c *resourceapi.ResourceClaim) time.Duration {
		start := time.Now()
		if _, err := a.Allocate(ctx, f.nodes[node], []*resourceapi.ResourceClaim{c}); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
	for n := range f.nodes { // warm the CEL cache
		run(n, plain)
		run(n, rewritten)
	}
	plainNs := make([][]time.Duration, len(f.nodes))
	rewrittenNs := make([][]time.Duration, len(f.nodes))
	b.ResetTimer()
	for b.Loop() {
		for n := range f.nodes {
			plainNs[n] = append(plainNs[n], run(n, plain))
			rewrittenNs[n] = append(rewrittenNs[n], run(n, rewritten))
		}
	}
	b.StopTimer()
	// Per-node medians: the machine is shared, and a GC pause or a
	// preemption inside one call would otherwise decide "the worst node".
	var plainSum, sum, worst float64
	var worstRatio float64
	worstModel := ""
	for n := range f.nodes {
		p, r := median(plainNs[n]), median(rewrittenNs[n])
		plainSum += p
		sum += r
		worst = max(worst, r)
		if r/p > worstRatio {
			worstRatio, worstModel = r/p, f.model[n]
		}
	}
	nodes := float64(len(f.nodes))
	b.ReportMetric(plainSum/nodes, "plain-ns/node")
	b.ReportMetric(sum/nodes, "ns/node")
	b.ReportMetric(worst, "worst-ns/node")
	b.ReportMetric(sum/plainSum, "x-mean")
	b.ReportMetric(worstRatio, "x-worst")
	b.Logf("worst ratio on a %s node", worstModel)
}

func median(d []time.Duration) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2])
}

func gpuSpec(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}
}

func exactGPU(name string, count int64, selectors ...string) resourceapi.DeviceRequest {
	r := resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: DeviceClassName,
		AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
		Count:           count,
	}}
	for _, s := range selectors {
		r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: s}})
	}
	return r
}

// BenchmarkSelectorEval shows where the allocator's time goes: one CEL
// evaluation builds maps of every attribute of the device before the
// expression runs, so its cost follows the attribute count, not the
// expression.
func BenchmarkSelectorEval(b *testing.B) {
	full := nodeSlice("n", loadSKUs(b)["H100"], 1).Spec.Devices[0]
	slim := full.DeepCopy()
	for name := range slim.Attributes {
		if name != "bandwidthClass" {
			delete(slim.Attributes, name)
		}
	}
	cache := cel.NewCache(10, cel.Features{})
	for _, tc := range []struct {
		name, expr string
		device     *resourceapi.Device
	}{
		{"class-selector/13-attributes", `device.driver == "gpu.prism.dev"`, &full},
		{"tier-selector/13-attributes", catalogue[selBandwidthUltra], &full},
		{"memory-selector/13-attributes", catalogue[selMemoryFirst+2], &full},
		{"class-selector/1-attribute", `device.driver == "gpu.prism.dev"`, slim},
	} {
		b.Run(tc.name, func(b *testing.B) {
			prog := cache.GetOrCompile(tc.expr)
			if prog.Error != nil {
				b.Fatal(prog.Error)
			}
			d := cel.Device{Driver: gpuv1alpha1.DriverName, Attributes: tc.device.Attributes, Capacity: tc.device.Capacity}
			for b.Loop() {
				if _, _, err := prog.DeviceMatches(context.Background(), d); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFitsGuard decides what keeps foreign devices out of a fits tier
// that has no generated selector: the user's class gpu.prism.dev (its
// selector is evaluated per device) or the selector-less
// TierDeviceClassName plus the same test as a claim selector. Both are one
// CEL evaluation per device visited; x-mean is the guard's cost over the
// class's, for latency-bound economy without hard needs (low, then fits).
func BenchmarkFitsGuard(b *testing.B) {
	f := newFleet(b, "H100", 125, 8, "A100-80", 125, 8, "L40S", 125, 8, "L4", 125, 8)
	a, _ := f.allocator(b, incubatingFeatures, nil)
	spec, _, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy})
	if err != nil {
		b.Fatal(err)
	}
	userClass := claimFor(spec)
	guarded := claimFor(spec.DeepCopy())
	fits := &guarded.Spec.Devices.Requests[0].FirstAvailable[1]
	if fits.DeviceClassName != DeviceClassName || len(fits.Selectors) != 0 {
		b.Fatalf("fits tier without hard needs: class %s, %d selectors", fits.DeviceClassName, len(fits.Selectors))
	}
	fits.DeviceClassName = TierDeviceClassName
	fits.Selectors = []resourceapi.DeviceSelector{selector(`device.driver == "` + gpuv1alpha1.DriverName + `"`)}
	benchmarkNodes(b, a, f, userClass, guarded)
}
