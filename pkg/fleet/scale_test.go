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

package fleet_test

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/fleet"
	"github.com/prismgpu/prism/pkg/fleet/fleettest"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/pkg/sim"
	"github.com/prismgpu/prism/pkg/webhook/profilewrites"
)

// The controller-scale phase of make bench, in process: 5,000 nodes of 8
// GPUs (fleettest.MixedModels, slices as the plugin publishes them) and 10
// claims per node, half allocated a GPU, half waiting.
const (
	scaleNodes         = 5000
	scaleClaimsPerNode = 10
)

// scaleCluster is the phase's objects as the API server stores them.
type scaleCluster struct {
	slices []*resourceapi.ResourceSlice
	claims []*resourceapi.ResourceClaim
}

func newScaleCluster(b *testing.B) *scaleCluster {
	cl, err := sim.BuildCluster(b.Context(), fleettest.MixedFleet("scale-", scaleNodes, 8, false))
	if err != nil {
		b.Fatal(err)
	}
	c := &scaleCluster{slices: cl.Slices}
	for i, s := range c.slices {
		s.UID, s.ResourceVersion = types.UID(fmt.Sprintf("slice-uid-%d", i)), "1"
		s.Spec.NodeName = &s.Spec.Pool.Name
	}
	// As the phase's createScaleClaim makes them: even claims hold a GPU of
	// a node in turn, odd ones wait, made by hand.
	for i := range scaleNodes * scaleClaimsPerNode {
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: "scale", UID: types.UID(fmt.Sprintf("claim-uid-%d", i)), ResourceVersion: "1",
				Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: "train"}},
			Spec: *sim.GPUClaim(1),
		}
		if i%2 == 0 {
			held := i / 2
			s := c.slices[held%len(c.slices)]
			claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
				Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: s.Spec.Pool.Name, Device: s.Spec.Devices[(held/len(c.slices))%len(s.Spec.Devices)].Name,
			}}}}
		}
		c.claims = append(c.claims, claim)
	}
	return c
}

// informerPath is what the controller's informers keep: the store of each
// (through its transform) and the handlers fed from it.
type informerPath struct {
	name                       string
	sliceTransform, claimTrans cache.TransformFunc
}

// fed is one path fed the whole cluster: what it holds of the slices and
// of the claims, and the time its transforms and handlers took, without
// the decoding.
type fed struct {
	slices, claims       cache.Indexer
	view                 *fleet.View
	profileClaims        *profilewrites.ProfileClaims
	sliceHeap, claimHeap uint64
	sliceTime, claimTime time.Duration
}

// feed decodes each object from protobuf, as the informers receive them
// from the API server, one at a time, and passes it through the path.
func feed(b *testing.B, c *scaleCluster, p informerPath) *fed {
	codec := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	encoder := scheme.Codecs.EncoderForVersion(codec, resourceapi.SchemeGroupVersion)
	decode := func(obj k8sruntime.Object) any {
		data, err := k8sruntime.Encode(encoder, obj)
		if err != nil {
			b.Fatal(err)
		}
		out, _, err := codec.Decode(data, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		return out
	}
	process := func(t cache.TransformFunc, obj any, store cache.Indexer, handlers ...cache.ResourceEventHandler) time.Duration {
		start := time.Now()
		if t != nil {
			var err error
			if obj, err = t(obj); err != nil {
				b.Fatal(err)
			}
		}
		if err := store.Add(obj); err != nil {
			b.Fatal(err)
		}
		for _, h := range handlers {
			h.OnAdd(obj, true)
		}
		return time.Since(start)
	}
	f := &fed{
		slices:        cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		claims:        cache.NewIndexer(cache.DeletionHandlingMetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc}),
		view:          fleet.NewView(),
		profileClaims: profilewrites.NewProfileClaims(),
	}
	before := heapInUse()
	for _, s := range c.slices {
		f.sliceTime += process(p.sliceTransform, decode(s), f.slices, f.view)
	}
	f.sliceHeap = heapInUse() - before
	before = heapInUse()
	for _, cl := range c.claims {
		f.claimTime += process(p.claimTrans, decode(cl), f.claims, f.view, f.profileClaims)
	}
	f.claimHeap = heapInUse() - before
	return f
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkControllerScale reports, for each informer path, the heap the
// informers' stores and the view hold at 5,000 nodes, the time to feed
// them, and what one admission costs after a claim changed: the fleet and
// the load it reads, and a load-aware rewrite. Run it once (b.N is not
// used):
//
//	go test ./pkg/fleet -run '^$' -bench ControllerScale -benchtime 1x
func BenchmarkControllerScale(b *testing.B) {
	c := newScaleCluster(b)
	for _, p := range []informerPath{
		{name: "whole objects"},
		{name: "trimmed ResourceSlices", sliceTransform: trimmedResourceSlice, claimTrans: profilewrites.TrimClaim},
		{name: "Slices", sliceTransform: fleet.TrimSlice, claimTrans: profilewrites.TrimClaim},
	} {
		b.Run(p.name, func(b *testing.B) {
			f := feed(b, c, p)
			b.ReportMetric(float64(f.sliceHeap)/(1<<20), "slices-MiB")
			b.ReportMetric(float64(f.claimHeap)/(1<<20), "claims-MiB")
			b.ReportMetric(f.sliceTime.Seconds(), "slices-s")
			b.ReportMetric(f.claimTime.Seconds(), "claims-s")

			spec := sim.GPUClaim(1)
			profile := rewrite.Profile{Name: "train", BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyLoadAware}
			changed := c.claims[0].DeepCopy()
			const admissions = 100
			start := time.Now()
			for i := range admissions {
				// A claim changes between two admissions: the load is read anew.
				changed.ResourceVersion = fmt.Sprint(i)
				f.view.OnUpdate(nil, changed)
				if _, _, err := rewrite.Rewrite(b.Context(), spec, profile, rewrite.WithFleet(f.view.Fleet()), rewrite.WithLoad(f.view.Load())); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(time.Since(start).Microseconds())/admissions, "admission-µs")
			runtime.KeepAlive(f)
		})
	}
}

// trimmedResourceSlice is the transform the informer had before Slice: a
// ResourceSlice with only the 8 attributes of each device that the view
// reads, its capacities and whether it may be shared.
func trimmedResourceSlice(obj any) (any, error) {
	s := obj.(*resourceapi.ResourceSlice)
	out := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion},
		Spec:       resourceapi.ResourceSliceSpec{Driver: s.Spec.Driver, Pool: s.Spec.Pool, NodeName: s.Spec.NodeName},
	}
	read := []gpuv1alpha1.AttributeName{
		gpuv1alpha1.ProductNameAttribute, gpuv1alpha1.MemoryBandwidthGBpsAttribute, gpuv1alpha1.FP32GFLOPSAttribute, gpuv1alpha1.CUDAComputeCapabilityAttribute,
		gpuv1alpha1.MIGProfileAttribute, gpuv1alpha1.MultiprocessorCountAttribute, gpuv1alpha1.UUIDAttribute, gpuv1alpha1.ParentUUIDAttribute,
	}
	out.Spec.Devices = make([]resourceapi.Device, len(s.Spec.Devices))
	for i, d := range s.Spec.Devices {
		t := resourceapi.Device{Name: d.Name, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations,
			Attributes: make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(read))}
		for _, id := range read {
			if a, ok := d.Attributes[id.Qualified()]; ok {
				t.Attributes[id.Qualified()] = a
			}
		}
		out.Spec.Devices[i] = t
	}
	return out, nil
}
