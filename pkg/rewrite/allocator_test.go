package rewrite

import (
	"context"
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"
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
			allH100AndA100.Insert(structured.MakeDeviceID(DriverName, s.Spec.Pool.Name, d.Name))
		}
	}
	for name, tc := range map[string]struct {
		profile   Profile
		allocated sets.Set[structured.DeviceID]
		// want is the request allocated on the H100, A100-40GB and L4 node.
		want []string
	}{
		"memory-bound prefers ultra": {
			profile: Profile{BoundType: MemoryBound, Policy: Performance, PeakMemory: qty("16Gi")},
			want:    []string{"gpu/ultra", "gpu/high", "gpu/fits"},
		},
		"fp32 compute-bound, 20 GB footprint never on L4": {
			profile: Profile{BoundType: ComputeBound, Policy: Performance, PeakMemory: qty("20G")},
			want:    []string{"gpu/fp32-fast", "gpu/fits", ""},
		},
		"fp32 compute-bound economy, 20 GB footprint never on L4": {
			profile: Profile{BoundType: ComputeBound, Policy: Economy, PeakMemory: qty("20G")},
			want:    []string{"gpu/fits", "gpu/fits", ""},
		},
		"latency-bound economy prefers L4": {
			profile: Profile{BoundType: LatencyBound, Policy: Economy, PeakMemory: qty("8Gi")},
			want:    []string{"gpu/fits", "gpu/fits", "gpu/low"},
		},
		"preferred devices taken, last tier still allocates": {
			profile:   Profile{BoundType: MemoryBound, Policy: Performance, PeakMemory: qty("16Gi")},
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
	for _, bound := range []BoundType{MemoryBound, ComputeBound, LatencyBound} {
		for _, policy := range []Policy{Performance, Economy} {
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
	f := qualifiedCapacity(newFleet(t, "H100", 1, 2))
	f.slices = append(f.slices, foreignSlice(f.nodes[0].Name, 4))
	gpus := sets.New[structured.DeviceID]()
	for _, d := range f.slices[0].Spec.Devices {
		gpus.Insert(structured.MakeDeviceID(DriverName, f.slices[0].Spec.Pool.Name, d.Name))
	}
	profiles := map[string]Profile{
		"tier and memory floor": {BoundType: MemoryBound, Policy: Performance, PeakMemory: qty("16Gi")},
		"tier and cc floor":     {BoundType: ComputeBound, Policy: Performance, MinComputeCapability: "8.0"},
		"no hard needs":         {BoundType: LatencyBound, Policy: Economy},
		"memory share":          {BoundType: LatencyBound, Policy: Economy, PeakMemory: qty("8Gi"), ShareMemory: true},
	}
	users := [][]string{nil, {`device.attributes["gpu.prism.dev"].numaNode == 0`}}
	for name, p := range profiles {
		for _, user := range users {
			for _, taken := range []bool{false, true} {
				var allocated sets.Set[structured.DeviceID]
				if taken {
					allocated = gpus
				}
				a, _ := f.allocator(t, incubatingFeatures, allocated)
				spec, _, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1, user...)), p)
				if err != nil {
					t.Fatal(err)
				}
				res, err := a.Allocate(context.Background(), f.nodes[0], []*resourceapi.ResourceClaim{claimFor(spec)})
				if err != nil {
					t.Errorf("%s, user %q, GPUs taken %v: %v", name, user, taken, err)
					continue
				}
				switch {
				case taken && len(res) != 0:
					t.Errorf("%s, user %q: allocated %+v with every GPU taken", name, user, res[0].Devices.Results)
				case !taken && (len(res) != 1 || res[0].Devices.Results[0].Driver != DriverName):
					t.Errorf("%s, user %q: allocated %+v, want one %s device", name, user, res, DriverName)
				}
			}
		}
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
				d.Capacity[MemoryCapacity] = c
			}
		}
	}
	return f
}
