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
	"iter"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
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
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
	"github.com/prismgpu/prism/internal/controller/webhook/profilewrites"
	"github.com/prismgpu/prism/internal/sim"
	"github.com/prismgpu/prism/pkg/rewrite"
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
	for i := range scaleNodes * scaleClaimsPerNode {
		c.claims = append(c.claims, scaleClaim(i, func(held int) (string, string) {
			s := c.slices[held%len(c.slices)]
			return s.Spec.Pool.Name, s.Spec.Devices[(held/len(c.slices))%len(s.Spec.Devices)].Name
		}))
	}
	return c
}

// scaleClaim is claim i as the phase's createScaleClaim makes it: even
// claims hold a GPU of a node in turn (the held-th GPU, in the pool and
// under the name that device gives), odd ones wait, made by hand.
func scaleClaim(i int, device func(held int) (pool, name string)) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("claim-%d", i), Namespace: "scale", UID: types.UID(fmt.Sprintf("claim-uid-%d", i)), ResourceVersion: "1",
			Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: "train"}},
		Spec: *sim.GPUClaim(1),
	}
	if i%2 == 0 {
		pool, name := device(i / 2)
		claim.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{{
			Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: pool, Device: name,
		}}}}
	}
	return claim
}

// informerPath is what the controller's informers keep: the store of each
// (through its transform) and the handlers fed from it.
type informerPath struct {
	name                       string
	sliceTransform, claimTrans cache.TransformFunc
}

// fed is one path fed the whole cluster: what it holds of the slices, of
// the claims and of both, and the time its transforms and handlers took,
// without the decoding.
type fed struct {
	slices, claims                 cache.Indexer
	view                           *fleet.View
	profileClaims                  *profilewrites.ProfileClaims
	sliceHeap, claimHeap, liveHeap uint64
	sliceTime, claimTime           time.Duration
}

// feed decodes each object from protobuf, as the informers receive them
// from the API server, one at a time, and passes it through the path.
func feed(b *testing.B, slices iter.Seq[*resourceapi.ResourceSlice], claims iter.Seq[*resourceapi.ResourceClaim], p informerPath) *fed {
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
	empty := heapInUse()
	for s := range slices {
		f.sliceTime += process(p.sliceTransform, decode(s), f.slices, f.view)
	}
	withSlices := heapInUse()
	for c := range claims {
		f.claimTime += process(p.claimTrans, decode(c), f.claims, f.view, f.profileClaims)
	}
	live := heapInUse()
	f.sliceHeap, f.claimHeap, f.liveHeap = withSlices-empty, live-withSlices, live-empty
	return f
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkControllerScale reports, for each informer path, the heap the
// informers' stores and their handlers (the view, the profile claims) hold
// at 5,000 nodes, of the slices, of the claims and of both, the time to
// feed them, and what one admission costs after a claim changed: the fleet
// and the load it reads, and a load-aware rewrite. Run it once (b.N is not
// used):
//
//	go test ./internal/controller/fleet -run '^$' -bench ControllerScale -benchtime 1x
func BenchmarkControllerScale(b *testing.B) {
	c := newScaleCluster(b)
	for _, p := range []informerPath{
		{name: "whole objects"},
		{name: "trimmed ResourceSlices and ResourceClaims", sliceTransform: trimmedResourceSlice, claimTrans: trimmedResourceClaim},
		{name: "Slices, trimmed ResourceClaims", sliceTransform: fleet.TrimSlice, claimTrans: trimmedResourceClaim},
		{name: "Slices and Claims", sliceTransform: fleet.TrimSlice, claimTrans: fleet.TrimClaim},
	} {
		b.Run(p.name, func(b *testing.B) {
			f := feed(b, slices.Values(c.slices), slices.Values(c.claims), p)
			b.ReportMetric(float64(f.sliceHeap)/(1<<20), "slices-MiB")
			b.ReportMetric(float64(f.claimHeap)/(1<<20), "claims-MiB")
			b.ReportMetric(float64(f.liveHeap)/(1<<20), "live-MiB")
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

// BenchmarkControllerRSS reports the resident memory of a process that
// holds what the controller's informers hold at 5,000 nodes, for the
// informer path of trimmed ResourceClaims and of Claims: right after the
// objects were fed (rss-MiB), of which anon-MiB is not the binary's
// pages (the test binary maps about twice the controller's), and at its
// peak while they were (peak-MiB).
// The objects are made as they are fed, one at a time, and dropped after
// (a node's slice is its model's, under the node's name), so that neither
// the cluster nor its encoding is held. The figures are the process's: run
// one path per process, with the GOMEMLIMIT to try, for example
//
//	go test ./internal/controller/fleet -run '^$' -bench 'ControllerRSS/^Claims$' -benchtime 1x
//	GOMEMLIMIT=100MiB go test ./internal/controller/fleet -run '^$' -bench 'ControllerRSS/^Claims$' -benchtime 1x
func BenchmarkControllerRSS(b *testing.B) {
	perModel := scaleNodes / len(fleettest.MixedModels)
	models, err := sim.BuildCluster(b.Context(), fleettest.MixedFleet("scale-", len(fleettest.MixedModels), 8, false))
	if err != nil {
		b.Fatal(err)
	}
	// Node n is node n%perModel of group n/perModel, as MixedFleet lays
	// them out.
	node := func(n int) string { return fmt.Sprintf("scale-g%d-%d", n/perModel, n%perModel) }
	nodeSlices := func(yield func(*resourceapi.ResourceSlice) bool) {
		for n := range scaleNodes {
			s := models.Slices[n/perModel].DeepCopy()
			name := node(n)
			s.Name, s.UID, s.ResourceVersion = name+"-"+gpuv1alpha1.DriverName, types.UID(fmt.Sprintf("slice-uid-%d", n)), "1"
			s.Spec.Pool.Name, s.Spec.NodeName = name, &name
			if !yield(s) {
				return
			}
		}
	}
	claims := func(yield func(*resourceapi.ResourceClaim) bool) {
		for i := range scaleNodes * scaleClaimsPerNode {
			c := scaleClaim(i, func(held int) (string, string) {
				devices := models.Slices[(held%scaleNodes)/perModel].Spec.Devices
				return node(held % scaleNodes), devices[(held/scaleNodes)%len(devices)].Name
			})
			if !yield(c) {
				return
			}
		}
	}
	for _, p := range []informerPath{
		{name: "trimmed ResourceClaims", sliceTransform: fleet.TrimSlice, claimTrans: trimmedResourceClaim},
		{name: "Claims", sliceTransform: fleet.TrimSlice, claimTrans: fleet.TrimClaim},
	} {
		b.Run(p.name, func(b *testing.B) {
			f := feed(b, nodeSlices, claims, p)
			b.ReportMetric(procStatusMiB(b, "VmRSS"), "rss-MiB")
			b.ReportMetric(procStatusMiB(b, "RssAnon"), "anon-MiB")
			b.ReportMetric(procStatusMiB(b, "VmHWM"), "peak-MiB")
			b.ReportMetric(float64(f.liveHeap)/(1<<20), "live-MiB")
			runtime.KeepAlive(f)
		})
	}
}

// procStatusMiB reads a figure of /proc/self/status, in MiB.
func procStatusMiB(b *testing.B, field string) float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Skip(err)
	}
	for line := range strings.Lines(string(status)) {
		if value, ok := strings.CutPrefix(line, field+":"); ok {
			kB, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(value), " kB"), 64)
			if err != nil {
				b.Fatal(err)
			}
			return kB / 1024
		}
	}
	b.Fatalf("no %s in /proc/self/status", field)
	return 0
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

// trimmedResourceClaim is the transform the informer had before Claim: a
// ResourceClaim with its name, UID and resourceVersion, a valid profile
// annotation, of an allocated claim its allocation's results, and of a
// waiting one its plan (up to 16 KiB), its controlling pod and its
// requests' classes, modes and counts.
func trimmedResourceClaim(obj any) (any, error) {
	c := obj.(*resourceapi.ResourceClaim)
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion}}
	if p, _ := prismv1alpha1.ProfileName(c.Annotations); p != "" {
		out.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: p}
	}
	if a := c.Status.Allocation; a != nil {
		out.Status.Allocation = &resourceapi.AllocationResult{}
		for _, r := range a.Devices.Results {
			out.Status.Allocation.Devices.Results = append(out.Status.Allocation.Devices.Results,
				resourceapi.DeviceRequestAllocationResult{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Request: r.Request})
		}
		return out, nil
	}
	if plan, ok := c.Annotations[rewrite.AnnotationKey]; ok && len(plan) <= 16<<10 {
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[rewrite.AnnotationKey] = plan
	}
	if owner := metav1.GetControllerOfNoCopy(c); owner != nil && owner.APIVersion == "v1" && owner.Kind == "Pod" {
		out.OwnerReferences = []metav1.OwnerReference{*owner}
	}
	for _, r := range c.Spec.Devices.Requests {
		kept := resourceapi.DeviceRequest{Name: r.Name}
		if e := r.Exactly; e != nil {
			kept.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: e.DeviceClassName, AllocationMode: e.AllocationMode, Count: e.Count}
		}
		for _, sub := range r.FirstAvailable {
			kept.FirstAvailable = append(kept.FirstAvailable, resourceapi.DeviceSubRequest{Name: sub.Name, DeviceClassName: sub.DeviceClassName, AllocationMode: sub.AllocationMode, Count: sub.Count})
		}
		out.Spec.Devices.Requests = append(out.Spec.Devices.Requests, kept)
	}
	return out, nil
}
