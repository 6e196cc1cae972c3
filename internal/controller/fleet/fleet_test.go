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

package fleet

import (
	"fmt"
	"maps"
	"reflect"

	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

var (
	h100 = fleettest.GPU{Product: "NVIDIA H100 80GB HBM3", BandwidthGBps: 3350, FP32GFLOPS: 66900, Memory: "81559Mi", CC: "9.0.0"}
	l4   = fleettest.GPU{Product: "NVIDIA L4", BandwidthGBps: 300, FP32GFLOPS: 30300, Memory: "23034Mi", CC: "8.9.0"}
)

func model(g fleettest.GPU, devices int) rewrite.Model {
	q := resource.MustParse(g.Memory)
	return rewrite.Model{Name: g.Product, Devices: devices, BandwidthGBps: g.BandwidthGBps, FP32GFLOPS: g.FP32GFLOPS, MemoryBytes: q.Value()}
}

func mixed(m rewrite.Model, devices int) rewrite.Model {
	m.MixedDevices = devices
	return m
}

func shared(m rewrite.Model, devices int) rewrite.Model {
	m.SharedDevices = devices
	return m
}

func withComputeLimits(m rewrite.Model, devices int) rewrite.Model {
	m.ComputeLimitDevices = devices
	return m
}

// grantingLimits marks the slice's devices from index first on as a
// plugin that grants compute limits publishes its shareable GPUs.
func grantingLimits(s *resourceapi.ResourceSlice, first int) *resourceapi.ResourceSlice {
	for i := first; i < len(s.Spec.Devices); i++ {
		s.Spec.Devices[i].Attributes[gpuv1alpha1.ComputeLimitsAttribute.Qualified()] = resourceapi.DeviceAttribute{BoolValue: ptr.To(true)}
	}
	return s
}

func withFigureCapacity(m rewrite.Model, devices int) rewrite.Model {
	m.FigureCapacityDevices = devices
	return m
}

// figuresAsCapacity publishes the figures of the slice's devices from index
// first on as capacities too, as the plugin does with --figures-as-capacity.
func figuresAsCapacity(s *resourceapi.ResourceSlice, first int) *resourceapi.ResourceSlice {
	for i := first; i < len(s.Spec.Devices); i++ {
		d := &s.Spec.Devices[i]
		for _, name := range []resourceapi.QualifiedName{"gpu.prism.dev/memoryBandwidthGBps", "gpu.prism.dev/fp32GFLOPS"} {
			d.Capacity[name] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(*d.Attributes[name].IntValue, resource.DecimalSI)}
		}
		if cc, ok := d.Attributes["gpu.prism.dev/cudaComputeCapability"]; ok {
			var major, minor int64
			fmt.Sscanf(*cc.VersionValue, "%d.%d", &major, &minor)
			d.Capacity[gpuv1alpha1.SMVersionCapacity.Qualified()] = resourceapi.DeviceCapacity{Value: *resource.NewQuantity(major*10+minor, resource.DecimalSI)}
		}
	}
	return s
}

// withoutSMVersion drops smVersion from the slice's device i, as the plugin
// does for a compute capability it cannot write as an sm_XY number.
func withoutSMVersion(s *resourceapi.ResourceSlice, i int) *resourceapi.ResourceSlice {
	delete(s.Spec.Devices[i].Capacity, gpuv1alpha1.SMVersionCapacity.Qualified())
	return s
}

// shareable publishes the slice's devices from index first on with
// allowMultipleAllocations, as the plugin does with memory sharing on.
func shareable(s *resourceapi.ResourceSlice, first int) *resourceapi.ResourceSlice {
	for i := first; i < len(s.Spec.Devices); i++ {
		s.Spec.Devices[i].AllowMultipleAllocations = ptr.To(true)
	}
	return s
}

func TestView(t *testing.T) {
	capped := h100
	capped.BandwidthGBps = 3000
	for _, tc := range []struct {
		name   string
		events func(v *View)
		want   []rewrite.Model
		// nodes is NodeModels; nil: not checked.
		nodes map[string][]string
	}{
		{"nothing published", func(*View) {}, []rewrite.Model{}, map[string][]string{}},
		{"two nodes, one mixed", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), true)
			v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, h100, l4), true)
		}, []rewrite.Model{mixed(model(h100, 3), 1), mixed(model(l4, 1), 1)},
			map[string][]string{"node-a": {h100.Product}, "node-b": {h100.Product, l4.Product}}},
		{"a node's two slices of one model are not mixed", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100), true)
			v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-a", 1, h100), true)
		}, []rewrite.Model{model(h100, 2)}, map[string][]string{"node-a": {h100.Product}}},
		{"two slices of one node with different models make it mixed", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100), true)
			v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-a", 1, l4), true)
		}, []rewrite.Model{mixed(model(h100, 1), 1), mixed(model(l4, 1), 1)}, map[string][]string{"node-a": {h100.Product, l4.Product}}},
		{"another driver's slices are not Prism's fleet", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, l4), true)
			v.OnAdd(fleettest.Slice("b", "gpu.example.com", "node-a", 1, h100), true)
		}, []rewrite.Model{model(l4, 1)}, nil},
		{"shareable GPUs are counted", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), true)
			v.OnAdd(shareable(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, h100, l4), 1), true)
		}, []rewrite.Model{mixed(model(h100, 3), 1), shared(mixed(model(l4, 1), 1), 1)}, nil},
		// A plugin from before compute limits publishes shareable GPUs
		// without the attribute; a GPU not shareable does not count even
		// with it.
		{"shareable GPUs that grant compute limits are counted", func(v *View) {
			v.OnAdd(grantingLimits(shareable(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), 0), 1), true)
			v.OnAdd(grantingLimits(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, h100), 0), true)
		}, []rewrite.Model{withComputeLimits(shared(model(h100, 3), 2), 1)}, nil},
		{"GPUs that publish their figures as capacities are counted", func(v *View) {
			v.OnAdd(figuresAsCapacity(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), 1), true)
			v.OnAdd(figuresAsCapacity(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, l4), 0), true)
		}, []rewrite.Model{withFigureCapacity(model(h100, 2), 1), withFigureCapacity(model(l4, 1), 1)}, nil},
		{"a GPU with a compute capability but no smVersion is not counted", func(v *View) {
			v.OnAdd(withoutSMVersion(figuresAsCapacity(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), 0), 1), true)
		}, []rewrite.Model{withFigureCapacity(model(h100, 2), 1)}, nil},
		{"a node leaves", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100), true)
			v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, l4), true)
			v.OnDelete(cache.DeletedFinalStateUnknown{Key: "b", Obj: fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, l4)})
		}, []rewrite.Model{model(h100, 1)}, map[string][]string{"node-a": {h100.Product}}},
		{"a republished pool counts once, at its newest generation", func(v *View) {
			v.OnAdd(fleettest.Slice("old", "gpu.prism.dev", "node-a", 1, h100, h100), true)
			v.OnAdd(fleettest.Slice("new", "gpu.prism.dev", "node-a", 2, h100), true)
		}, []rewrite.Model{model(h100, 1)}, nil},
		{"a node's devices change", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100), true)
			v.OnUpdate(nil, fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, l4))
		}, []rewrite.Model{model(l4, 1)}, map[string][]string{"node-a": {l4.Product}}},
		{"a slower board of a model sets the model's figure", func(v *View) {
			v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, capped), true)
		}, []rewrite.Model{model(capped, 2)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			tc.events(v)
			if got := v.Fleet().Models; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("fleet\n got %+v\nwant %+v", got, tc.want)
			}
			if got := v.NodeModels(); tc.nodes != nil && !reflect.DeepEqual(got, tc.nodes) {
				t.Errorf("node models %v, want %v", got, tc.nodes)
			}
		})
	}
}

// TestViewFeedsRewrite: the view's fleet cuts a ladder, and a change of the
// fleet changes the ladder of the next claim.
func TestViewFeedsRewrite(t *testing.T) {
	v := NewView()
	v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, l4, l4), true)
	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
	p := rewrite.Profile{Name: "stream", BoundType: prismv1alpha1.BoundTypeMemoryBound}
	_, plan, err := rewrite.Rewrite(t.Context(), spec, p, rewrite.WithFleet(v.Fleet()))
	if err != nil || len(plan.Rewritten) != 0 {
		t.Fatalf("an L4-only fleet: want the claim unchanged, got %v, %+v", err, plan)
	}
	v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, h100), true)
	_, plan, err = rewrite.Rewrite(t.Context(), spec, p, rewrite.WithFleet(v.Fleet()))
	if err != nil || len(plan.Rewritten) != 1 || plan.Alternatives[0].Name != "bandwidth-top" {
		t.Fatalf("after an H100 node joined: want a bandwidth-top tier, got %v, %+v", err, plan)
	}
}

func allocated(uid, pool string, devices ...string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)}, Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}}}
	for _, d := range devices {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.prism.dev", Pool: pool, Device: d})
	}
	return c
}

func waiting(uid string, plan string, reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: uid, UID: types.UID(uid)}, Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}}
	if plan != "" {
		c.Annotations = map[string]string{rewrite.AnnotationKey: plan}
	}
	return c
}

func exactly(class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: "r", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count}}
}

func TestViewLoad(t *testing.T) {
	v := NewView()
	v.OnAdd(fleettest.Slice("a", "gpu.prism.dev", "node-a", 1, h100, h100, h100, h100), true)
	v.OnAdd(fleettest.Slice("b", "gpu.prism.dev", "node-b", 1, l4, l4), true)
	events := []func(){
		func() { v.OnAdd(allocated("held", "node-a", "gpu-0", "gpu-1"), true) },
		// A shared GPU held by two claims is one device less, not two.
		func() { v.OnAdd(allocated("shares", "node-a", "gpu-1"), true) },
		func() {
			c := allocated("other-driver", "node-b", "gpu-0")
			c.Status.Allocation.Devices.Results[0].Driver = "gpu.example.com"
			v.OnAdd(c, true)
		},
		func() { fromTemplate(v, waiting("plain-4", "", exactly("gpu.prism.dev", 4)), "job-0") },
		func() {
			rewritten := resourceapi.DeviceRequest{Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "bandwidth-top", DeviceClassName: rewrite.TierDeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
				{Name: "fits", DeviceClassName: "gpu.prism.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}
			c := waiting("profiled-1", `{"boundType":"ComputeBound"}`, rewritten, exactly("nic.example.com", 1))
			c.Namespace, c.Annotations["prism.dev/profile"] = "team-a", "sgemm"
			fromTemplate(v, c, "job-1")
			v.OnAdd(profile("team-a", "sgemm", prismv1alpha1.BoundTypeComputeBound), true)
		},
		func() { fromTemplate(v, waiting("nic-only", "", exactly("nic.example.com", 2)), "job-2") },
	}
	for _, e := range events {
		e()
	}
	want := &rewrite.Load{
		Free:    map[string]int{h100.Product: 2, l4.Product: 2},
		Pending: []rewrite.Pending{{Devices: 4}, {Devices: 1, BoundType: prismv1alpha1.BoundTypeComputeBound}},
	}
	got := v.Load()
	slices.SortFunc(got.Pending, func(a, b rewrite.Pending) int { return b.Devices - a.Devices })
	if !reflect.DeepEqual(got, want) {
		t.Errorf("load\n got %+v\nwant %+v", got, want)
	}

	// The four-GPU claim is allocated, the held one released.
	v.OnUpdate(nil, allocated("plain-4", "node-a", "gpu-2", "gpu-3"))
	v.OnDelete(allocated("held", "node-a", "gpu-0", "gpu-1"))
	v.OnDelete(cache.DeletedFinalStateUnknown{Obj: allocated("shares", "node-a", "gpu-1")})
	want = &rewrite.Load{Free: map[string]int{h100.Product: 2, l4.Product: 2}, Pending: []rewrite.Pending{{Devices: 1, BoundType: prismv1alpha1.BoundTypeComputeBound}}}
	if got := v.Load(); !reflect.DeepEqual(got, want) {
		t.Errorf("after the allocation\n got %+v\nwant %+v", got, want)
	}
}

// A GPU in MIG mode, as the plugin publishes it: its partitions are not
// devices of its model (they would add devices and, through the slowest
// figure, a partition's bandwidth), but partitions of the fleet, which the
// rewrite sizes a slice from.
func TestViewKeepsPartitionsApart(t *testing.T) {
	v := NewView()
	for _, s := range explaintest.MIGSlices(t) {
		s.UID = types.UID(s.Name)
		trimmed, err := TrimSlice(&s)
		if err != nil {
			t.Fatal(err)
		}
		v.OnAdd(trimmed, true)
	}
	f := v.Fleet()
	if len(f.Models) != 1 || f.Models[0].Devices != 2 || f.Models[0].Multiprocessors != 108 || f.Models[0].BandwidthGBps < 1500 {
		t.Fatalf("models: want the two whole A100-40GB with 108 SMs and their own bandwidth, got %+v", f.Models)
	}
	got := map[string]rewrite.PartitionModel{}
	for _, p := range f.Partitions {
		got[p.Profile] = p
	}
	want := rewrite.PartitionModel{Model: "NVIDIA A100-SXM4-40GB", Profile: "2g.10gb", Devices: 3, MemoryBytes: 9856 << 20, Multiprocessors: 28}
	if diff := cmp.Diff(want, got["2g.10gb"]); diff != "" {
		t.Errorf("2g.10gb (-want +got):\n%s", diff)
	}
	if len(got) != 7 {
		t.Errorf("want the A100-40GB's 7 profiles, got %v", slices.Collect(maps.Keys(got)))
	}

	spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
	p95, peak := int32(5_000), resource.MustParse("3Gi")
	p := rewrite.Profile{Name: "light", Usage: &prismv1alpha1.UsageProfile{Runs: 3, DutyCycleP95MilliPercent: &p95, PeakMemory: &peak}}
	out, plan, err := rewrite.Rewrite(t.Context(), spec, p, rewrite.WithFleet(f), rewrite.PartitionsFromUsage())
	if err != nil || plan.Partition == nil || plan.Partition.Verdict != "sized" {
		t.Fatalf("want a partition, got %v, %+v", err, plan.Partition)
	}
	if sub := out.Devices.Requests[0].FirstAvailable[0]; sub.Name != "mig-2g10gb" || sub.DeviceClassName != rewrite.MIGDeviceClassName {
		t.Errorf("first tier %s of %s, want mig-2g10gb of %s", sub.Name, sub.DeviceClassName, rewrite.MIGDeviceClassName)
	}
}

// TestLoadCountsHeldPartitions: a claim that holds a MIG partition keeps
// the GPU it is cut from out of every whole-GPU claim's reach, so that GPU
// is not free; two partitions of one GPU take it once.
func TestLoadCountsHeldPartitions(t *testing.T) {
	migSlices := explaintest.MIGSlices(t)
	// parentOf maps each partition to its GPU's device name, from the
	// published uuids, as the plugin wrote them.
	gpuByUUID, parentOf := map[string]string{}, map[string]string{}
	for _, s := range migSlices {
		for _, d := range s.Spec.Devices {
			if u := d.Attributes["gpu.prism.dev/uuid"].StringValue; u != nil && d.Attributes["gpu.prism.dev/migProfile"].StringValue == nil {
				gpuByUUID[*u] = d.Name
			}
		}
	}
	var partitions []string
	for _, s := range migSlices {
		for _, d := range s.Spec.Devices {
			if p := d.Attributes["gpu.prism.dev/parentUUID"].StringValue; p != nil {
				parentOf[d.Name] = gpuByUUID[*p]
				partitions = append(partitions, d.Name)
			}
		}
	}
	if len(partitions) < 2 || parentOf[partitions[0]] != parentOf[partitions[1]] || parentOf[partitions[0]] == "" {
		t.Fatalf("the fixture's first two partitions should share a published GPU: %v", parentOf)
	}
	const a100 = "NVIDIA A100-SXM4-40GB"
	for _, tc := range []struct {
		name  string
		holds [][]string // devices held, one claim each
		free  int
	}{
		{"nothing held", nil, 2},
		{"a partition holds its GPU", [][]string{{partitions[0]}}, 1},
		{"two partitions of one GPU hold it once", [][]string{{partitions[0]}, {partitions[1]}}, 1},
		{"a partition and the GPU it is cut from count once", [][]string{{partitions[0]}, {parentOf[partitions[0]]}}, 1},
		{"a partition and the other GPU", [][]string{{partitions[0]}, {"gpu-1"}}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewView()
			for _, s := range migSlices {
				s.UID = types.UID(s.Name)
				trimmed, err := TrimSlice(&s)
				if err != nil {
					t.Fatal(err)
				}
				v.OnAdd(trimmed, true)
			}
			for i, devices := range tc.holds {
				v.OnAdd(allocated(fmt.Sprintf("claim-%d", i), explaintest.MIGNode, devices...), true)
			}
			if diff := cmp.Diff(map[string]int{a100: tc.free}, v.Load().Free); diff != "" {
				t.Errorf("free devices (-want +got):\n%s", diff)
			}
		})
	}
}
