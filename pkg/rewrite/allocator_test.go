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
	"fmt"
	"strings"
	"testing"

	"github.com/blang/semver/v4"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// allocateOnEachNode runs the allocator once per node, as the scheduler's
// Filter does, and returns the request the device was allocated for
// ("gpu/ultra"), or "" where the claim does not fit.
func allocateOnEachNode(t *testing.T, f *fleet, a structured.Allocator, spec *resourceapi.ResourceClaimSpec) []string {
	t.Helper()
	out := make([]string, len(f.nodes))
	for i, node := range f.nodes {
		res, err := a.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claimFor(spec)})
		if err != nil {
			t.Fatalf("node %s: %v", node.Name, err)
		}
		if len(res) == 1 {
			out[i] = res[0].Devices.Results[0].Request
		}
	}
	return out
}

func TestAllocatorPicksTier(t *testing.T) {
	f := newFleet(t, "H100", 1, 8, "A100-40", 1, 8, "L4", 1, 4)
	allH100AndA100 := sets.New[structured.DeviceID]()
	for _, s := range f.slices[:2] {
		for _, d := range s.Spec.Devices {
			allH100AndA100.Insert(structured.MakeDeviceID(gpuv1alpha1.DriverName, s.Spec.Pool.Name, d.Name))
		}
	}
	for name, tc := range map[string]struct {
		profile   Profile
		allocated sets.Set[structured.DeviceID]
		// want is the request allocated on the H100, A100-40GB and L4 node.
		want []string
	}{
		"memory-bound prefers ultra": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")},
			want:    []string{"gpu/ultra", "gpu/high", "gpu/fits"},
		},
		"fp32 compute-bound, 20 GB footprint never on L4": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("20G")},
			want:    []string{"gpu/fp32-fast", "gpu/fits", ""},
		},
		"fp32 compute-bound economy, 20 GB footprint never on L4": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("20G")},
			want:    []string{"gpu/fits", "gpu/fits", ""},
		},
		"latency-bound economy prefers L4": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("8Gi")},
			want:    []string{"gpu/fits", "gpu/fits", "gpu/low"},
		},
		"preferred devices taken, last tier still allocates": {
			profile:   Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")},
			allocated: allH100AndA100,
			want:      []string{"", "", "gpu/fits"},
		},
	} {
		t.Run(name, func(t *testing.T) {
			for _, impl := range []struct {
				name     string
				features structured.Features
			}{{"stable", stableFeatures}, {"incubating", incubatingFeatures}} {
				a, _ := f.allocator(t, impl.features, tc.allocated)
				plain := gpuSpec(exactGPU("gpu", 1))
				spec, _, err := Rewrite(context.Background(), plain, tc.profile)
				if err != nil {
					t.Fatal(err)
				}
				if got := allocateOnEachNode(t, f, a, spec); !equalStrings(got, tc.want) {
					t.Errorf("%s: allocated %q, want %q", impl.name, got, tc.want)
				}
				// The plain claim accepts any free GPU, so it is the
				// baseline the last tier is compared with.
				for i, got := range allocateOnEachNode(t, f, a, plain) {
					if free := tc.want[i] != "" || tc.allocated == nil; free && got != "gpu" {
						t.Errorf("%s: plain claim not allocated on %s", impl.name, f.nodes[i].Name)
					}
				}
			}
		})
	}
}

// TestNeverLessSchedulable checks on every known GPU model that a rewritten
// request fits exactly where a plain request with the hard needs and the
// user's selectors fits.
func TestNeverLessSchedulable(t *testing.T) {
	skus := loadSKUs(t)
	var layout []any
	for model := range skus {
		layout = append(layout, model, 1, 2)
	}
	f := newFleet(t, layout...)
	a, _ := f.allocator(t, incubatingFeatures, nil)
	users := [][]string{nil, {`device.attributes["gpu.prism.dev"].numaNode == 0`}, {`device.attributes["gpu.prism.dev"].architecture != "Hopper"`}}
	for _, bound := range []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound} {
		for _, policy := range []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy} {
			for _, peak := range []string{"", "6Gi", "14Gi", "20G", "40Gi", "70Gi", "120Gi"} {
				for _, cc := range []string{"", "8.0", "9.0"} {
					for _, user := range users {
						p := Profile{BoundType: bound, Policy: policy, MinComputeCapability: cc}
						if peak != "" {
							p.PeakMemory = qty(peak)
						}
						spec, _, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 2, user...)), p)
						if err != nil {
							t.Fatal(err)
						}
						subs := spec.Devices.Requests[0].FirstAvailable
						last := subs[len(subs)-1]
						if n := len(last.Selectors) - len(user); n < 0 || n > 2 {
							t.Fatalf("last tier has %d generated selectors", n)
						}
						baseline := exactGPU("gpu", 2)
						baseline.Exactly.Selectors = last.Selectors
						got := allocateOnEachNode(t, f, a, spec)
						want := allocateOnEachNode(t, f, a, gpuSpec(baseline))
						for i := range got {
							if (got[i] == "") != (want[i] == "") {
								t.Errorf("%s/%s peak %q cc %q user %q on %s: rewritten %q, hard needs only %q",
									bound, policy, peak, cc, user, f.model[i], got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestHeadroomKeepsModelsInTheirBucket guards the bucket floors: each GPU
// model must pass the floor of its own memory class, or profiles that
// ask for e.g. 60 GiB would never reach an H100.
func TestHeadroomKeepsModelsInTheirBucket(t *testing.T) {
	skus := loadSKUs(t)
	want := map[string]int64{"H100": 79, "H200": 139, "A100-80": 79, "A100-40": 39, "L40S": 44, "A10": 22, "RTX4090": 22, "L4": 22, "T4": 15}
	for model, gi := range want {
		s, ok := skus[model]
		if !ok {
			t.Fatalf("no SKU %s", model)
		}
		f := newFleet(t, model, 1, 1)
		a, _ := f.allocator(t, stableFeatures, nil)
		for _, floor := range memoryFloorsGi {
			got := allocateOnEachNode(t, f, a, gpuSpec(exactGPU("gpu", 1, memoryAtLeast(floor))))[0] != ""
			if got != (floor <= gi) {
				t.Errorf("%s (%s): passes %dGi floor = %v, want %v", model, s.Memory, floor, got, floor <= gi)
			}
		}
	}
}

// foreignSlice publishes n devices of another driver on node. Their
// attributes live in that driver's domain, so a lookup in the gpu.prism.dev
// domain finds an empty map and an unguarded one is a CEL error.
func foreignSlice(node string, n int) *resourceapi.ResourceSlice {
	devices := make([]resourceapi.Device, n)
	for i := range devices {
		devices[i] = resourceapi.Device{
			Name: fmt.Sprintf("eth%d", i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				"numaNode": iattr(0), "bandwidthClass": attr("ultra"),
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"memory": {Value: resource.MustParse("200Gi")}},
		}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-nic"},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: "nic.example.com", NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: node + "-nic", ResourceSliceCount: 1},
			Devices: devices,
		},
	}
}

// TestTierClassKeepsForeignDevicesOut: the class of generated subrequests
// has no selectors, so the subrequests themselves must keep another
// driver's devices out, and must do so before a user selector written for
// gpu.prism.dev devices (here an unguarded lookup) runs on them.
func TestTierClassKeepsForeignDevicesOut(t *testing.T) {
	f := figureCapacities(qualifiedCapacity(newFleet(t, "H100", 1, 2)))
	f.slices = append(f.slices, foreignSlice(f.nodes[0].Name, 4))
	gpus := sets.New[structured.DeviceID]()
	for _, d := range f.slices[0].Spec.Devices {
		gpus.Insert(structured.MakeDeviceID(gpuv1alpha1.DriverName, f.slices[0].Spec.Pool.Name, d.Name))
	}
	profiles := map[string]Profile{
		"tier and memory floor": {BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi")},
		"tier and cc floor":     {BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyPerformance, MinComputeCapability: "8.0"},
		"no hard needs":         {BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy},
		"memory share":          {BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("8Gi"), ShareMemory: true},
	}
	users := [][]string{nil, {`device.attributes["gpu.prism.dev"].numaNode == 0`}}
	// Bounds need a fleet with a choice: the H100 node and L4s elsewhere.
	withL4 := published(figureCapacities(qualifiedCapacity(newFleet(t, "H100", 1, 2, "L4", 1, 2))))
	bounds := []Option{WithFleet(withL4), MemoryFloorAsCapacity(), TierBoundsAsCapacity()}
	// The stable allocator ignores capacity requests, as an API server
	// without DRAConsumableCapacity drops them: a capacity floor must not be
	// what keeps foreign devices out.
	variants := []struct {
		name     string
		features structured.Features
		opts     []Option
	}{
		{"CEL floor", incubatingFeatures, nil},
		{"capacity floor", incubatingFeatures, []Option{MemoryFloorAsCapacity()}},
		{"capacity floor, gate off", stableFeatures, []Option{MemoryFloorAsCapacity()}},
		// A tier left without selectors has only the uuid guard against
		// other drivers' devices where capacity requests are ignored.
		{"capacity bounds", incubatingFeatures, bounds},
		{"capacity bounds, gate off", stableFeatures, bounds},
	}
	boundsApplied := 0
	for name, p := range profiles {
		for _, v := range variants {
			for _, user := range users {
				for _, taken := range []bool{false, true} {
					var allocated sets.Set[structured.DeviceID]
					if taken {
						allocated = gpus
					}
					a, _ := f.allocator(t, v.features, allocated)
					spec, plan, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1, user...)), p, v.opts...)
					if err != nil {
						t.Fatal(err)
					}
					if plan.TierBounds.Form == FormCapacity {
						boundsApplied++
					}
					res, err := a.Allocate(context.Background(), f.nodes[0], []*resourceapi.ResourceClaim{claimFor(spec)})
					if err != nil {
						t.Errorf("%s, %s, user %q, GPUs taken %v: %v", name, v.name, user, taken, err)
						continue
					}
					switch {
					case taken && len(res) != 0:
						t.Errorf("%s, %s, user %q: allocated %+v with every GPU taken", name, v.name, user, res[0].Devices.Results)
					case !taken && (len(res) != 1 || res[0].Devices.Results[0].Driver != gpuv1alpha1.DriverName):
						t.Errorf("%s, %s, user %q: allocated %+v, want one %s device", name, v.name, user, res, gpuv1alpha1.DriverName)
					}
				}
			}
		}
	}
	if boundsApplied == 0 {
		t.Fatal("no case wrote its tier bounds as capacity requests")
	}
}

// qualifiedCapacity names the fleet's capacities as the kubelet plugin
// publishes them ("gpu.prism.dev/memory"): a capacity request must name the
// capacity exactly as the slice does, while CEL sees both spellings alike.
func qualifiedCapacity(f *fleet) *fleet {
	for _, s := range f.slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			if c, ok := d.Capacity["memory"]; ok {
				delete(d.Capacity, "memory")
				d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()] = c
			}
		}
	}
	return f
}

// memoryRequest is the subrequest's gpu.prism.dev/memory capacity request,
// or "".
func memoryRequest(sub resourceapi.DeviceSubRequest) string {
	if sub.Capacity == nil {
		return ""
	}
	q, ok := sub.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]
	if !ok {
		return ""
	}
	return q.String()
}

// TestCapacityFloorAllocatesWhereTheCELFloorDoes: on GPUs that are not
// shareable, a capacity request is a floor. Every model, every ladder and
// memory bucket must allocate the same tier with it as with the CEL floor,
// the whole GPU (no share), and the memory selector must be gone.
func TestCapacityFloorAllocatesWhereTheCELFloorDoes(t *testing.T) {
	var layout []any
	for model := range loadSKUs(t) {
		layout = append(layout, model, 1, 2)
	}
	f := qualifiedCapacity(newFleet(t, layout...))
	a, _ := f.allocator(t, incubatingFeatures, nil)
	users := [][]string{nil, {`device.attributes["gpu.prism.dev"].numaNode == 0`}}
	for _, bound := range []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound} {
		for _, policy := range []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy} {
			for _, peak := range []string{"6Gi", "14Gi", "20G", "40Gi", "70Gi", "120Gi"} {
				for _, user := range users {
					p := Profile{BoundType: bound, Policy: policy, PeakMemory: qty(peak)}
					plain := gpuSpec(exactGPU("gpu", 1, user...))
					cel, _, err := Rewrite(context.Background(), plain, p)
					if err != nil {
						t.Fatal(err)
					}
					capacity, _, err := Rewrite(context.Background(), plain, p, MemoryFloorAsCapacity())
					if err != nil {
						t.Fatal(err)
					}
					for _, sub := range capacity.Devices.Requests[0].FirstAvailable {
						for _, s := range exprs(sub.Selectors) {
							if strings.HasPrefix(s, `"memory" in`) {
								t.Fatalf("%s/%s %s: tier %s keeps a memory selector %q", bound, policy, peak, sub.Name, s)
							}
						}
						if memoryRequest(sub) == "" {
							t.Fatalf("%s/%s %s: tier %s has no memory request", bound, policy, peak, sub.Name)
						}
					}
					want := allocateOnEachNode(t, f, a, cel)
					for i, node := range f.nodes {
						res, err := a.Allocate(context.Background(), node, []*resourceapi.ResourceClaim{claimFor(capacity)})
						if err != nil {
							t.Fatalf("%s: %v", node.Name, err)
						}
						got := ""
						if len(res) == 1 {
							r := res[0].Devices.Results[0]
							got = r.Request
							if r.ShareID != nil || len(r.ConsumedCapacity) > 0 {
								t.Errorf("%s/%s %s on %s: capacity floor made a share: %+v", bound, policy, peak, f.model[i], r)
							}
						}
						if got != want[i] {
							t.Errorf("%s/%s %s user %q on %s: capacity floor allocated %q, CEL floor %q", bound, policy, peak, user, f.model[i], got, want[i])
						}
					}
				}
			}
		}
	}
}

// shareable publishes the fleet's GPUs as the kubelet plugin does with
// memory sharing on: several claims may take memory from one GPU, and a
// claim that names no amount takes all of it.
func shareable(f *fleet) *fleet {
	step := resource.MustParse("1Gi")
	for _, s := range f.slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			c := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]
			whole := resource.NewQuantity(c.Value.Value()/step.Value()*step.Value(), resource.BinarySI)
			c.RequestPolicy = &resourceapi.CapacityRequestPolicy{Default: whole, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &step, Step: &step}}
			d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()] = c
			d.AllowMultipleAllocations = ptr.To(true)
		}
	}
	return f
}

// TestCapacityFloorIsAShareOnShareableGPUs is why MemoryFloorAsCapacity is
// not the default: on a shareable GPU the floor is what the claim consumes,
// so a claim that asked for a whole GPU leaves room for others.
func TestCapacityFloorIsAShareOnShareableGPUs(t *testing.T) {
	f := shareable(qualifiedCapacity(newFleet(t, "H100", 1, 1)))
	a, _ := f.allocator(t, incubatingFeatures, nil)
	p := Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("14Gi")}
	for _, tc := range []struct {
		name     string
		opts     []Option
		consumed string
	}{
		{"CEL floor takes the whole GPU", nil, "79Gi"},
		{"capacity floor takes only the floor", []Option{MemoryFloorAsCapacity()}, "22Gi"},
	} {
		spec, _, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), p, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		res, err := a.Allocate(context.Background(), f.nodes[0], []*resourceapi.ResourceClaim{claimFor(spec)})
		if err != nil || len(res) != 1 {
			t.Fatalf("%s: %v, %d results", tc.name, err, len(res))
		}
		got := res[0].Devices.Results[0].ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]
		if got.String() != tc.consumed {
			t.Errorf("%s: consumed %s, want %s", tc.name, got.String(), tc.consumed)
		}
	}
}

// TestCapacityFloorNeedsConsumableCapacity: a scheduler without
// DRAConsumableCapacity runs the stable allocator, which ignores capacity
// requests, so the floor is silently lost and a 20 GB footprint lands on a
// 24 GB card. The CEL floor holds on both; the option is only for clusters
// with the gate on.
func TestCapacityFloorNeedsConsumableCapacity(t *testing.T) {
	f := qualifiedCapacity(newFleet(t, "L4", 1, 1))
	p := Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("20Gi")}
	for _, tc := range []struct {
		allocator string
		features  structured.Features
		opts      []Option
		want      string
	}{
		{"incubating", incubatingFeatures, nil, ""},
		{"incubating", incubatingFeatures, []Option{MemoryFloorAsCapacity()}, ""},
		{"stable", stableFeatures, nil, ""},
		{"stable", stableFeatures, []Option{MemoryFloorAsCapacity()}, "gpu/fits"},
	} {
		a, _ := f.allocator(t, tc.features, nil)
		spec, _, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), p, tc.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if got := allocateOnEachNode(t, f, a, spec)[0]; got != tc.want {
			t.Errorf("%s allocator, capacity floor %v: allocated %q on an L4, want %q", tc.allocator, len(tc.opts) > 0, got, tc.want)
		}
	}
}

// TestCapacityFloorKeepsCELWhereTheRequestIsNotTheFloor: a memory share
// and an amount the user wrote are capacity requests already; the floor
// stays in CEL beside them.
func TestCapacityFloorKeepsCELWhereTheRequestIsNotTheFloor(t *testing.T) {
	userAmount := resource.MustParse("30Gi")
	for _, tc := range []struct {
		name      string
		share     bool
		userAsks  *resource.Quantity
		wantFloor bool   // the CEL memory floor is kept
		wantReq   string // the memory request of every tier
	}{
		{"whole GPU: the floor becomes the request", false, nil, false, "39Gi"},
		{"memory share: the share is the request", true, nil, true, "24Gi"},
		{"the user's amount is kept", false, &userAmount, true, "30Gi"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := exactGPU("gpu", 1)
			if tc.userAsks != nil {
				req.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): *tc.userAsks}}
			}
			p := Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("20Gi"), ShareMemory: tc.share}
			out, _, err := Rewrite(context.Background(), gpuSpec(req), p, MemoryFloorAsCapacity())
			if err != nil {
				t.Fatal(err)
			}
			for _, sub := range out.Devices.Requests[0].FirstAvailable {
				hasFloor := false
				for _, s := range exprs(sub.Selectors) {
					hasFloor = hasFloor || s == memoryAtLeast(39)
				}
				if hasFloor != tc.wantFloor || memoryRequest(sub) != tc.wantReq {
					t.Errorf("tier %s: CEL floor %v (want %v), memory request %q (want %q)", sub.Name, hasFloor, tc.wantFloor, memoryRequest(sub), tc.wantReq)
				}
				// A tier left without selectors keeps the user's class: a
				// capacity request is no guard where the gate is off.
				wantClass := DeviceClassName
				if len(sub.Selectors) > 0 {
					wantClass = TierDeviceClassName
				}
				if sub.DeviceClassName != wantClass {
					t.Errorf("tier %s: class %s, want %s", sub.Name, sub.DeviceClassName, wantClass)
				}
			}
		})
	}
}

// figureCapacities publishes the fleet's figures as capacities too, as the
// kubelet plugin does with --figures-as-capacity.
func figureCapacities(f *fleet) *fleet {
	for _, s := range f.slices {
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			for _, fig := range []figure{figBandwidth, figFP32} {
				if a, ok := d.Attributes[resourceapi.QualifiedName(fig.attribute())]; ok {
					d.Capacity[fig.capacity()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(*a.IntValue, resource.DecimalSI)}
				}
			}
			if a, ok := d.Attributes["cudaComputeCapability"]; ok {
				v := semver.MustParse(*a.VersionValue)
				d.Capacity[gpuv1alpha1.SMVersionCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(int64(v.Major*10+v.Minor), resource.DecimalSI)}
			}
		}
	}
	return f
}

// published is the fleet as the controller's fleet view reads it from the
// slices.
func published(f *fleet) *Fleet {
	byName := map[string]*Model{}
	var order []string
	for _, s := range f.slices {
		for _, d := range s.Spec.Devices {
			name := *d.Attributes["productName"].StringValue
			m, ok := byName[name]
			if !ok {
				m = &Model{Name: name, BandwidthGBps: *d.Attributes["memoryBandwidthGBps"].IntValue, FP32GFLOPS: *d.Attributes["fp32GFLOPS"].IntValue}
				byName[name] = m
				order = append(order, name)
			}
			m.Devices++
			if c, ok := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
				m.MemoryBytes = max(m.MemoryBytes, c.Value.Value())
			}
			_, bw := d.Capacity[figBandwidth.capacity()]
			_, sm := d.Capacity[gpuv1alpha1.SMVersionCapacity.Qualified()]
			if bw && sm {
				m.FigureCapacityDevices++
			}
		}
	}
	out := &Fleet{}
	for _, name := range order {
		out.Models = append(out.Models, *byName[name])
	}
	return out
}

// TestTierBoundsAllocateWhereCELDoes: on GPUs that are not shareable, a
// tier bound written as a capacity request selects what its CEL test does.
// On a fleet of every known model, with the preferred GPUs free and taken,
// every profile must allocate the same tier on every node either way, and
// where the bounds are capacity requests no tier may keep its CEL test.
func TestTierBoundsAllocateWhereCELDoes(t *testing.T) {
	var layout []any
	for model := range loadSKUs(t) {
		layout = append(layout, model, 1, 2)
	}
	f := figureCapacities(qualifiedCapacity(newFleet(t, layout...)))
	fleetOpt := WithFleet(published(f))
	taken := sets.New[structured.DeviceID]()
	for i, s := range f.slices {
		if f.model[i] == "H100" || f.model[i] == "H200" {
			for _, d := range s.Spec.Devices {
				taken.Insert(structured.MakeDeviceID(gpuv1alpha1.DriverName, s.Spec.Pool.Name, d.Name))
			}
		}
	}
	users := [][]string{nil, {`device.attributes["gpu.prism.dev"].numaNode == 0`}}
	exercised := 0
	for _, allocated := range []sets.Set[structured.DeviceID]{nil, taken} {
		a, _ := f.allocator(t, incubatingFeatures, allocated)
		for _, bound := range []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound} {
			for _, policy := range []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy} {
				for _, peak := range []string{"6Gi", "14Gi", "20G", "40Gi", "70Gi"} {
					for _, cc := range []string{"", "8.0", "8.9"} {
						for _, user := range users {
							p := Profile{BoundType: bound, Policy: policy, PeakMemory: qty(peak), MinComputeCapability: cc}
							plain := gpuSpec(exactGPU("gpu", 1, user...))
							cel, _, err := Rewrite(context.Background(), plain, p, fleetOpt, MemoryFloorAsCapacity())
							if err != nil {
								t.Fatal(err)
							}
							capacity, plan, err := Rewrite(context.Background(), plain, p, fleetOpt, MemoryFloorAsCapacity(), TierBoundsAsCapacity())
							if err != nil {
								t.Fatal(err)
							}
							what := fmt.Sprintf("%s/%s %s cc %q user %q", bound, policy, peak, cc, user)
							if plan.TierBounds.Form == FormCapacity {
								exercised++
								checkBounds(t, what, capacity, len(user) == 0)
							}
							want := allocateOnEachNode(t, f, a, cel)
							got := allocateOnEachNode(t, f, a, capacity)
							for i := range f.nodes {
								if got[i] != want[i] {
									t.Errorf("%s on %s: capacity bounds allocated %q, CEL bounds %q", what, f.model[i], got[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
	if exercised == 0 {
		t.Fatal("no profile got its tier bounds as capacity requests")
	}
}

// checkBounds: a tier with a bound request keeps no CEL threshold, the
// request carries the uuid guard, and a subrequest without selectors is in
// the class without selectors only where the user wrote none.
func checkBounds(t *testing.T, what string, spec *resourceapi.ResourceClaimSpec, noUserSelectors bool) {
	t.Helper()
	if len(spec.Devices.Constraints) != 1 || *spec.Devices.Constraints[0].MatchAttribute != GuardAttribute {
		t.Errorf("%s: constraints %+v, want the uuid guard", what, spec.Devices.Constraints)
	}
	bounded := 0
	for _, sub := range spec.Devices.Requests[0].FirstAvailable {
		for capacity, test := range map[resourceapi.QualifiedName]string{
			figBandwidth.capacity():                   string(figBandwidth.attribute()) + " >=",
			figFP32.capacity():                        string(figFP32.attribute()) + " >=",
			gpuv1alpha1.SMVersionCapacity.Qualified(): "cudaComputeCapability",
		} {
			if sub.Capacity == nil {
				continue
			}
			if _, ok := sub.Capacity.Requests[capacity]; !ok {
				continue
			}
			bounded++
			for _, s := range exprs(sub.Selectors) {
				if strings.Contains(s, test) {
					t.Errorf("%s: tier %s has a %s capacity request and keeps %q", what, sub.Name, capacity, s)
				}
			}
		}
		if len(sub.Selectors) == 0 && (sub.DeviceClassName == TierDeviceClassName) != noUserSelectors {
			t.Errorf("%s: tier %s without selectors is in class %s", what, sub.Name, sub.DeviceClassName)
		}
	}
	if bounded == 0 {
		t.Errorf("%s: plan says capacity, but no tier has a bound request", what)
	}
}
