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

package gpu_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/deviceclasses"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

var migBoards = []string{"NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"}

// migNode discovers a simulated node of count GPUs in MIG mode and lays
// out its ResourceSlices as the API would store them.
func migNode(t *testing.T, product string, count int) []*resourceapi.ResourceSlice {
	t.Helper()
	ctx := klog.NewContext(t.Context(), logr.Discard())
	fleet := &nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040,
		GPUs: []nvml.GPUGroup{{Product: product, Count: count, MIGMode: true}}}
	sim, err := nvml.NewSimulated(fleet, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	devices, err := nvml.Discover(ctx, sim, nvml.Options{})
	if err != nil {
		t.Fatal(err)
	}
	content, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{SysFS: sim.SysFS()})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]*resourceapi.ResourceSlice, len(content))
	for i, c := range content {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("node-a-%d", i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         gpuv1alpha1.DriverName,
				Pool:           resourceapi.ResourcePool{Name: "node-a", Generation: 1, ResourceSliceCount: int64(len(content))},
				NodeName:       ptr.To("node-a"),
				Devices:        c.Devices,
				SharedCounters: c.SharedCounters,
			},
		}
	}
	return out
}

func counterSets(slices []*resourceapi.ResourceSlice) map[string]map[string]int64 {
	out := map[string]map[string]int64{}
	for _, s := range slices {
		for _, set := range s.Spec.SharedCounters {
			out[set.Name] = map[string]int64{}
			for name, c := range set.Counters {
				out[set.Name][name] = c.Value.Value()
			}
		}
	}
	return out
}

func allDevices(slices []*resourceapi.ResourceSlice) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range slices {
		out = append(out, s.Spec.Devices...)
	}
	return out
}

// memorySlices are the memory-slice counters a device consumes, which is
// its placement.
func memorySlices(d resourceapi.Device) sets.Set[string] {
	out := sets.New[string]()
	for _, c := range d.ConsumesCounters {
		for name := range c.Counters {
			if len(name) > len("memory-slice-") && name[:len("memory-slice-")] == "memory-slice-" {
				out.Insert(c.CounterSet + "/" + name)
			}
		}
	}
	return out
}

func usesOFA(d resourceapi.Device) bool {
	c, ok := d.ConsumesCounters[0].Counters["optical-flow-accelerators"]
	return ok && c.Value.Sign() > 0
}

// fits reports whether the counters of both devices together stay within
// their sets.
func fits(sets map[string]map[string]int64, a, b resourceapi.Device) bool {
	used := map[string]int64{}
	for _, d := range []resourceapi.Device{a, b} {
		for _, c := range d.ConsumesCounters {
			for name, v := range c.Counters {
				key := c.CounterSet + "/" + name
				used[key] += v.Value.Value()
				if used[key] > sets[c.CounterSet][name] {
					return false
				}
			}
		}
	}
	return true
}

// Two devices of one GPU whose placements overlap (the whole GPU overlaps
// everything) never fit in the counters together, and two whose placements
// are disjoint do, unless both need the one optical-flow accelerator.
func TestOverlappingPlacementsNeverFitTogether(t *testing.T) {
	for _, product := range migBoards {
		t.Run(product, func(t *testing.T) {
			slices := migNode(t, product, 1)
			sets, devices := counterSets(slices), allDevices(slices)
			pairs := 0
			for i, a := range devices {
				if len(a.ConsumesCounters) == 0 {
					t.Fatalf("%s consumes no counters", a.Name)
				}
				for _, b := range devices[i+1:] {
					overlap := memorySlices(a).Intersection(memorySlices(b)).Len() > 0
					bothMedia := usesOFA(a) && usesOFA(b)
					if got, want := fits(sets, a, b), !overlap && !bothMedia; got != want {
						t.Errorf("%s and %s fit together: %v, want %v (placements overlap: %v)", a.Name, b.Name, got, want, overlap)
					}
					pairs++
				}
			}
			if pairs < 300 {
				t.Errorf("checked %d pairs; the node publishes too few devices", pairs)
			}
		})
	}
}

// An 8-GPU A100 node in MIG mode publishes every placement of every GPU
// within the limits of k8s.io/api/resource/v1 (types.go): at most 64
// devices per slice when they consume counters, 8 counter sets per slice
// and 32 counters per set, 2 consumptions per device of at most 32
// counters, 32 attributes and capacities per device, DNS-label names, and
// a slice holds devices or counters but not both.
func TestEightGPUMIGNodeRespectsSliceLimits(t *testing.T) {
	slices := migNode(t, "NVIDIA A100-SXM4-40GB", 8)
	sets := counterSets(slices)
	if len(sets) != 8 {
		t.Errorf("%d counter sets, want one per GPU", len(sets))
	}
	names := map[string]bool{}
	for _, s := range slices {
		spec := s.Spec
		if len(spec.Devices) > 0 && len(spec.SharedCounters) > 0 {
			t.Errorf("slice %s holds both devices and counter sets", s.Name)
		}
		if n := len(spec.SharedCounters); n > resourceapi.ResourceSliceMaxCounterSets {
			t.Errorf("slice %s has %d counter sets, limit %d", s.Name, n, resourceapi.ResourceSliceMaxCounterSets)
		}
		for _, set := range spec.SharedCounters {
			if n := len(set.Counters); n > resourceapi.ResourceSliceMaxCountersPerCounterSet {
				t.Errorf("counter set %s has %d counters, limit %d", set.Name, n, resourceapi.ResourceSliceMaxCountersPerCounterSet)
			}
			for name := range set.Counters {
				if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
					t.Errorf("counter %s/%s: %v", set.Name, name, errs)
				}
			}
		}
		if n := len(spec.Devices); n > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice %s has %d devices that consume counters, limit %d", s.Name, n, resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		}
		for _, d := range spec.Devices {
			if names[d.Name] {
				t.Errorf("device %s published twice", d.Name)
			}
			names[d.Name] = true
			if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
				t.Errorf("device name %s: %v", d.Name, errs)
			}
			if n := len(d.Attributes) + len(d.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("device %s has %d attributes and capacities", d.Name, n)
			}
			if n := len(d.ConsumesCounters); n > resourceapi.ResourceSliceMaxDeviceCounterConsumptionsPerDevice {
				t.Errorf("device %s has %d counter consumptions", d.Name, n)
			}
			for _, c := range d.ConsumesCounters {
				if len(c.Counters) > resourceapi.ResourceSliceMaxCountersPerDeviceCounterConsumption {
					t.Errorf("device %s consumes %d counters", d.Name, len(c.Counters))
				}
				for name := range c.Counters {
					if _, ok := sets[c.CounterSet][name]; !ok {
						t.Errorf("device %s consumes %s/%s, which no counter set has", d.Name, c.CounterSet, name)
					}
				}
			}
		}
	}
	// Every GPU: itself, 7 1g.5gb, 7 1g.5gb+me, 4 1g.10gb, 3 2g.10gb,
	// 2 3g.20gb, a 4g.20gb and a 7g.40gb.
	if got, want := len(names), 8*26; got != want {
		t.Errorf("%d devices published, want %d (every placement of every GPU)", got, want)
	}
}

// The scheduler's own allocator, on one A100 in MIG mode: two 3g.20gb
// partitions fit, a third does not, and the whole GPU cannot be allocated
// beside a partition.
func TestAllocatorHonoursPartitionCounters(t *testing.T) {
	slices := migNode(t, "NVIDIA A100-SXM4-40GB", 1)
	gpuClass := deviceclasses.Of(&resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: "gpu"},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + gpuv1alpha1.DriverName + `"`},
		}}},
	})
	request := func(name, expr string) resourceapi.DeviceRequest {
		return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: "gpu",
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           1,
			Selectors:       []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}},
		}}
	}
	threeG := `device.attributes["gpu.prism.dev"].?migProfile.orValue("") == "3g.20gb"`
	oneG := `device.attributes["gpu.prism.dev"].?migProfile.orValue("") == "1g.5gb"`
	whole := `!("migProfile" in device.attributes["gpu.prism.dev"])`
	for _, tc := range []struct {
		name     string
		requests []resourceapi.DeviceRequest
		fits     bool
	}{
		{"two 3g", []resourceapi.DeviceRequest{request("a", threeG), request("b", threeG)}, true},
		{"three 3g", []resourceapi.DeviceRequest{request("a", threeG), request("b", threeG), request("c", threeG)}, false},
		// Seven 1g.5gb devices exist, but two 3g.20gb leave no memory slice.
		{"two 3g and a 1g", []resourceapi.DeviceRequest{request("a", threeG), request("b", threeG), request("c", oneG)}, false},
		{"a 3g and a 1g", []resourceapi.DeviceRequest{request("a", threeG), request("b", oneG)}, true},
		{"whole GPU", []resourceapi.DeviceRequest{request("a", whole)}, true},
		{"whole GPU beside a 3g", []resourceapi.DeviceRequest{request("a", threeG), request("b", whole)}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			state := structured.AllocatedState{
				AllocatedDevices:         sets.New[structured.DeviceID](),
				AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
				AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
			}
			features := structured.Features{PartitionableDevices: true, PrioritizedList: true}
			a, err := structured.NewAllocator(t.Context(), features, state, gpuClass, slices, cel.NewCache(10, cel.Features{}))
			if err != nil {
				t.Fatal(err)
			}
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid-1"},
				Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: tc.requests}},
			}
			res, err := a.Allocate(t.Context(), &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, []*resourceapi.ResourceClaim{claim})
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			if got := len(res) == 1; got != tc.fits {
				t.Fatalf("allocated: %v, want %v (%+v)", got, tc.fits, res)
			}
			if tc.fits {
				var got []string
				for _, r := range res[0].Devices.Results {
					got = append(got, r.Device)
				}
				t.Logf("allocated %v", got)
			}
		})
	}
}

// sliceLayout names what each slice holds: its counter sets, or its
// devices, partitions counted per GPU and profile.
func sliceLayout(content []gpu.Slice) []string {
	var out []string
	for _, s := range content {
		var names []string
		for _, set := range s.SharedCounters {
			names = append(names, "counters "+set.Name)
		}
		counted := map[string]int{}
		var order []string
		for _, d := range s.Devices {
			key := d.Name
			if p, ok := d.Attributes[gpuv1alpha1.MIGProfileAttribute.Qualified()]; ok {
				key = fmt.Sprintf("gpu-%d %s", *d.Attributes[gpuv1alpha1.IndexAttribute.Qualified()].IntValue, *p.StringValue)
			}
			if counted[key] == 0 {
				order = append(order, key)
			}
			counted[key]++
		}
		for _, key := range order {
			if counted[key] > 1 {
				key = fmt.Sprintf("%s ×%d", key, counted[key])
			}
			names = append(names, key)
		}
		out = append(out, strings.Join(names, ", "))
	}
	return out
}

// The slices of a node, in the order the scheduler's allocator walks them:
// GPUs not in MIG mode, the counter sets, every GPU in MIG mode whole, then
// each one's partitions, of the profiles PublishOptions.MIGProfiles lists.
// A GPU left without partitions is still published whole, consuming its
// counters, and gets no slice of partitions.
func TestResourceSlicesLayout(t *testing.T) {
	const a100 = "NVIDIA A100-SXM4-40GB"
	a100Partitions := func(gpu int) string {
		return fmt.Sprintf("gpu-%[1]d 1g.5gb ×7, gpu-%[1]d 1g.5gb+me ×7, gpu-%[1]d 1g.10gb ×4, gpu-%[1]d 2g.10gb ×3, gpu-%[1]d 3g.20gb ×2, gpu-%[1]d 4g.20gb, gpu-%[1]d 7g.40gb", gpu)
	}
	for _, tc := range []struct {
		name     string
		groups   []nvml.GPUGroup
		profiles []string
		want     []string
	}{{
		name:   "every profile",
		groups: []nvml.GPUGroup{{Product: a100, Count: 2, MIGMode: true}},
		want:   []string{"counters gpu-0, counters gpu-1", "gpu-0, gpu-1", a100Partitions(0), a100Partitions(1)},
	}, {
		name:   "GPUs not in MIG mode first",
		groups: []nvml.GPUGroup{{Product: a100, Count: 1, MIGMode: true}, {Product: a100, Count: 2}},
		want:   []string{"gpu-1, gpu-2", "counters gpu-0", "gpu-0", a100Partitions(0)},
	}, {
		name:     "the profiles listed",
		groups:   []nvml.GPUGroup{{Product: a100, Count: 2, MIGMode: true}},
		profiles: []string{"3g.20gb", "1g.10gb"},
		want:     []string{"counters gpu-0, counters gpu-1", "gpu-0, gpu-1", "gpu-0 1g.10gb ×4, gpu-0 3g.20gb ×2", "gpu-1 1g.10gb ×4, gpu-1 3g.20gb ×2"},
	}, {
		name:     "no profile the GPU has",
		groups:   []nvml.GPUGroup{{Product: a100, Count: 2, MIGMode: true}},
		profiles: []string{"1g.10gb+me"},
		want:     []string{"counters gpu-0, counters gpu-1", "gpu-0, gpu-1"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := klog.NewContext(t.Context(), logr.Discard())
			sim, err := nvml.NewSimulated(&nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: tc.groups}, "node-a")
			if err != nil {
				t.Fatal(err)
			}
			devices, err := nvml.Discover(ctx, sim, nvml.Options{})
			if err != nil {
				t.Fatal(err)
			}
			content, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{MIGProfiles: tc.profiles})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, sliceLayout(content)); diff != "" {
				t.Errorf("slices (-want +got):\n%s", diff)
			}
			// Whole or not, a GPU in MIG mode takes all of its counters.
			sets := map[string]map[string]resourceapi.Counter{}
			for _, s := range content {
				for _, set := range s.SharedCounters {
					sets[set.Name] = set.Counters
				}
			}
			for _, s := range content {
				for _, d := range s.Devices {
					if _, partition := d.Attributes[gpuv1alpha1.MIGProfileAttribute.Qualified()]; partition {
						continue
					}
					var want []resourceapi.DeviceCounterConsumption
					if counters, inMIGMode := sets[d.Name]; inMIGMode {
						want = []resourceapi.DeviceCounterConsumption{{CounterSet: d.Name, Counters: counters}}
					}
					if diff := cmp.Diff(want, d.ConsumesCounters); diff != "" {
						t.Errorf("%s consumes (-want +got):\n%s", d.Name, diff)
					}
				}
			}
		})
	}
}
