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
	"cmp"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"

	gocmp "github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestViewForgetsHistory: the view is kept by events, each moving what it
// touches; after any sequence of them it holds what a new view fed only
// the objects that remain holds. Random slices over a few pools and
// nodes (several generations, mixed models, figures that differ, MIG
// partitions whose GPU is in the pool or not), claims that hold their
// devices or wait, and the pods and profiles the load reads.
func TestViewForgetsHistory(t *testing.T) {
	for seed := range uint64(50) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			r := rand.New(rand.NewPCG(seed, 1))
			v := NewView()
			w := &world{slices: map[string]*resourceapi.ResourceSlice{}, claims: map[string]*resourceapi.ResourceClaim{}, pods: map[string]*corev1.Pod{},
				profiles: map[string]*prismv1alpha1.WorkloadProfile{}}
			for step := range 300 {
				w.step(r, v)
				if step%25 == 24 {
					fresh := NewView()
					w.feed(fresh)
					compareViews(t, fmt.Sprintf("step %d", step), fresh, v)
				}
			}
		})
	}
}

// world is what remains of the objects the events made.
type world struct {
	slices   map[string]*resourceapi.ResourceSlice
	claims   map[string]*resourceapi.ResourceClaim
	pods     map[string]*corev1.Pod
	profiles map[string]*prismv1alpha1.WorkloadProfile
}

func (w *world) feed(v *View) {
	for _, k := range slices.Sorted(maps.Keys(w.slices)) {
		trimmed, _ := TrimSlice(w.slices[k])
		v.OnAdd(trimmed, true)
	}
	for _, k := range slices.Sorted(maps.Keys(w.claims)) {
		trimmed, _ := TrimClaim(w.claims[k])
		v.OnAdd(trimmed, true)
	}
	for _, k := range slices.Sorted(maps.Keys(w.pods)) {
		v.OnAdd(w.pods[k], true)
	}
	for _, k := range slices.Sorted(maps.Keys(w.profiles)) {
		v.OnAdd(w.profiles[k], true)
	}
}

// step makes, changes or deletes one object at random.
func (w *world) step(r *rand.Rand, v *View) {
	del := r.IntN(4) == 0
	tombstone := func(obj any) any {
		if r.IntN(2) == 0 {
			return cache.DeletedFinalStateUnknown{Obj: obj}
		}
		return obj
	}
	switch r.IntN(4) {
	case 0:
		name := fmt.Sprintf("slice-%d", r.IntN(8))
		if old, ok := w.slices[name]; ok && del {
			delete(w.slices, name)
			trimmed, _ := TrimSlice(old)
			v.OnDelete(tombstone(pick[any](r, old, trimmed)))
			return
		}
		s := randomSlice(r, name)
		w.slices[name] = s
		trimmed, _ := TrimSlice(s)
		v.OnUpdate(nil, pick[any](r, s, trimmed))
	case 1:
		name := fmt.Sprintf("claim-%d", r.IntN(10))
		if old, ok := w.claims[name]; ok && del {
			delete(w.claims, name)
			trimmed, _ := TrimClaim(old)
			v.OnDelete(tombstone(pick[any](r, old, trimmed)))
			return
		}
		c := randomClaim(r, name)
		w.claims[name] = c
		trimmed, _ := TrimClaim(c)
		v.OnUpdate(nil, pick[any](r, c, trimmed))
	case 2:
		name := fmt.Sprintf("pod-%d", r.IntN(4))
		if old, ok := w.pods[name]; ok && del {
			delete(w.pods, name)
			v.OnDelete(tombstone(old))
			return
		}
		var claims []string
		for i := range 10 {
			if r.IntN(3) == 0 {
				claims = append(claims, fmt.Sprintf("claim-%d", i))
			}
		}
		p := podNaming("ns", name, claims...)
		w.pods[name] = p
		v.OnUpdate(nil, p)
	case 3:
		name := fmt.Sprintf("profile-%d", r.IntN(2))
		if old, ok := w.profiles[name]; ok && del {
			delete(w.profiles, name)
			v.OnDelete(tombstone(old))
			return
		}
		p := profile("ns", name, pick(r, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeMemoryBound, ""))
		w.profiles[name] = p
		v.OnUpdate(nil, p)
	}
}

func pick[T any](r *rand.Rand, choices ...T) T { return choices[r.IntN(len(choices))] }

// randomSlice is a slice of one of three pools, mostly on the pool's node,
// with up to four GPUs and three MIG partitions, named after the slice as
// a pool's devices are unique in it; a partition's GPU may be of another
// slice.
func randomSlice(r *rand.Rand, name string) *resourceapi.ResourceSlice {
	pool := fmt.Sprintf("pool-%d", r.IntN(3))
	capped := h100
	capped.BandwidthGBps = 3000
	var gpus []fleettest.GPU
	for range r.IntN(5) {
		gpus = append(gpus, pick(r, h100, capped, a100, l4))
	}
	s := fleettest.Slice(name, pick(r, gpuv1alpha1.DriverName, gpuv1alpha1.DriverName, gpuv1alpha1.DriverName, "gpu.example.com"), pool, int64(1+r.IntN(3)), gpus...)
	s.Spec.NodeName = ptr.To(pick(r, pool, pool, pool, "node-x"))
	for i := range s.Spec.Devices {
		d := &s.Spec.Devices[i]
		d.Name = fmt.Sprintf("%s-gpu-%d", name, i)
		d.Attributes[gpuv1alpha1.UUIDAttribute.Qualified()] = resourceapi.DeviceAttribute{StringValue: ptr.To("GPU-" + d.Name)}
		d.Attributes[gpuv1alpha1.MultiprocessorCountAttribute.Qualified()] = resourceapi.DeviceAttribute{IntValue: ptr.To(pick[int64](r, 0, 108, 132))}
		if r.IntN(3) == 0 {
			d.AllowMultipleAllocations = ptr.To(true)
		}
	}
	for i := range r.IntN(4) {
		s.Spec.Devices = append(s.Spec.Devices, resourceapi.Device{
			Name: fmt.Sprintf("%s-mig-%d", name, i),
			Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
				gpuv1alpha1.ProductNameAttribute.Qualified():         {StringValue: ptr.To(a100.Product)},
				gpuv1alpha1.MIGProfileAttribute.Qualified():          {StringValue: ptr.To(pick(r, "1g.10gb", "2g.20gb"))},
				gpuv1alpha1.ParentUUIDAttribute.Qualified():          {StringValue: ptr.To(fmt.Sprintf("GPU-slice-%d-gpu-%d", r.IntN(8), r.IntN(4)))},
				gpuv1alpha1.MultiprocessorCountAttribute.Qualified(): {IntValue: ptr.To(pick[int64](r, 14, 28))},
			},
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{gpuv1alpha1.MemoryCapacity.Qualified(): {Value: resource.MustParse(pick(r, "9856Mi", "19968Mi"))}},
		})
	}
	return s
}

// randomClaim holds up to two devices of the pools, or waits for up to
// four GPUs, made from a pod's template or by hand.
func randomClaim(r *rand.Rand, name string) *resourceapi.ResourceClaim {
	if r.IntN(2) == 0 {
		var devices []string
		for range 1 + r.IntN(2) {
			devices = append(devices, fmt.Sprintf("slice-%d-%s-%d", r.IntN(8), pick(r, "gpu", "mig"), r.IntN(4)))
		}
		c := allocated(name, fmt.Sprintf("pool-%d", r.IntN(3)), devices...)
		c.Namespace = "ns"
		return c
	}
	c := unused("ns", name, pick(r, "", "profile-0", "profile-1"), int64(1+r.IntN(4)))
	if r.IntN(4) > 0 {
		ofPod(c, fmt.Sprintf("pod-%d", r.IntN(4)))
	}
	return c
}

func compareViews(t *testing.T, when string, want, got *View) {
	t.Helper()
	if diff := gocmp.Diff(want.Fleet(), got.Fleet()); diff != "" {
		t.Errorf("%s: fleet (-fresh +kept):\n%s", when, diff)
	}
	if diff := gocmp.Diff(want.NodeModels(), got.NodeModels()); diff != "" {
		t.Errorf("%s: node models (-fresh +kept):\n%s", when, diff)
	}
	sorted := cmpopts.SortSlices(func(a, b rewrite.Pending) bool {
		return cmp.Or(a.Devices-b.Devices, cmp.Compare(a.BoundType, b.BoundType)) < 0
	})
	if diff := gocmp.Diff(want.Load(), got.Load(), sorted, cmpopts.EquateEmpty()); diff != "" {
		t.Errorf("%s: load (-fresh +kept):\n%s", when, diff)
	}
}
