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

// Package fleet keeps prism-controller's live view of the GPUs Prism
// publishes: which models, how many devices of each, and the figures the
// rewrite ranks them by; and of their load: which devices claims hold, and
// which claims still wait. It is fed by a ResourceSlice, a ResourceClaim,
// a WorkloadProfile and a Pod informer (pods not yet scheduled), so a
// claim is cut for the fleet and the load at its admission.
//
// The load is read from what tenants write, so it trusts little of it. A
// claim without an allocation counts as waiting only when a pod's claim
// template made it: the pod is its controlling owner (which
// profilewrites.TrimClaim keeps), and the pod's status, which
// kube-controller-manager writes and the tenant cannot, names the claim. A
// claim made by hand, or with an ownerReference its creator pointed at a
// pod, counts only once it is allocated, when it holds devices. A waiting
// claim counts with at most maxPendingDevices GPUs (never more than the
// fleet publishes), and with the bound type of the WorkloadProfile its
// prism.dev/profile annotation names in its namespace, never with the one
// its prism.dev/rewrite annotation states.
package fleet

import (
	"cmp"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// View is a cache.ResourceEventHandler for a ResourceSlice, a ResourceClaim
// (claims as profilewrites.TrimClaim keeps them), a WorkloadProfile and a
// Pod informer (UnscheduledPods, as TrimPod keeps them). Fleet and Load
// are safe to call from any goroutine; they are on the path of every
// admitted claim, so Fleet is one atomic load and Load is rebuilt only
// after a change.
type View struct {
	mu     sync.Mutex
	slices map[types.UID]sliceSummary
	claims map[types.UID]claimSummary
	// boundTypes are the profiles' measured bound types; a profile without
	// one is not kept.
	boundTypes map[types.NamespacedName]prismv1alpha1.BoundType
	// pods are the unscheduled pods that claims were made for; a pod
	// without one is not kept.
	pods map[types.NamespacedName]podClaims
	// deviceModel maps the devices of current pool generations to their
	// model.
	deviceModel map[deviceKey]string
	// partitionParent maps the MIG partitions of current pool generations
	// to the GPU they are cut from: a claim that holds a partition keeps
	// the whole GPU from every other claim that asks for one.
	partitionParent map[deviceKey]deviceKey
	load            *rewrite.Load // nil: rebuild on the next Load
	// nodeModels maps each node with Prism GPUs to the models it
	// publishes, sorted.
	nodeModels map[string][]string
	// changed is signalled, without blocking, when the fleet changes.
	changed chan struct{}

	fleet atomic.Pointer[rewrite.Fleet]
}

type deviceKey struct{ pool, device string }

// sliceSummary is what one slice contributes; the slice itself is not kept.
type sliceSummary struct {
	pool       string
	node       string // the pool's node; the pool's name when the slice names none
	generation int64
	models     map[string]rewrite.Model
	devices    map[string]string // device name -> model
	uuids      map[string]string // a GPU's uuid -> its device name
	parents    map[string]string // a partition's device name -> its GPU's uuid
	// partitions are the MIG partitions, keyed by model and profile; they
	// are not devices of models.
	partitions map[partitionKey]rewrite.PartitionModel
}

type partitionKey struct{ model, profile string }

// claimSummary is what one claim contributes: the Prism devices it holds,
// or, while it has none and a pod's template made it, what it waits for.
type claimSummary struct {
	held    []deviceKey
	pending *pendingClaim
}

// pendingClaim is a waiting claim; its bound type and whether its pod uses
// it are looked up when the load is built, so that a profile measured
// later, or a pod status written after the claim, counts.
type pendingClaim struct {
	devices int
	profile types.NamespacedName // Name "": the claim names no profile
	claim   string               // the claim's name
	pod     types.NamespacedName // its controlling owner
	podUID  types.UID
}

// maxPendingDevices is the most GPUs one waiting claim counts with:
// AllocationResultsMaxSize, the most devices one allocation holds. The API
// accepts a claim of up to DeviceRequestsMaxSize (32) requests, each of
// any count, but the scheduler's allocator refuses a claim whose requests
// add up to more than an allocation holds, so no claim ever takes more of
// the fleet. Such a claim still counts, capped: the view does not try to
// tell whether a claim can be allocated at all (one for 32 GPUs waits
// forever on a fleet without a 32-GPU node just as well); it bounds what
// one claim weighs by what one claim can ever take.
const maxPendingDevices = resourceapi.AllocationResultsMaxSize

// NewView returns a View of an empty fleet.
func NewView() *View {
	v := &View{slices: map[types.UID]sliceSummary{}, claims: map[types.UID]claimSummary{}, boundTypes: map[types.NamespacedName]prismv1alpha1.BoundType{},
		pods: map[types.NamespacedName]podClaims{}, changed: make(chan struct{}, 1)}
	v.publish()
	return v
}

// Fleet returns the fleet as last seen. Callers must not modify it.
func (v *View) Fleet() *rewrite.Fleet {
	return v.fleet.Load()
}

// Changed is signalled after the fleet changed; one signal may stand for
// several changes.
func (v *View) Changed() <-chan struct{} { return v.changed }

// NodeModels returns, per node with Prism GPUs, the models it publishes
// (sorted), as last seen. The map is the caller's.
func (v *View) NodeModels() map[string][]string {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make(map[string][]string, len(v.nodeModels))
	for n, m := range v.nodeModels {
		out[n] = slices.Clone(m)
	}
	return out
}

// Load returns free devices per model and the pending claims as last seen.
// Callers must not modify it.
func (v *View) Load() *rewrite.Load {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.load != nil {
		return v.load
	}
	l := &rewrite.Load{Free: map[string]int{}}
	published := 0 // the GPUs of the fleet
	for _, m := range v.fleet.Load().Models {
		l.Free[m.Name] = m.Devices
		published += m.Devices
	}
	held := map[deviceKey]bool{}
	for _, c := range v.claims {
		for _, k := range c.held {
			if parent, ok := v.partitionParent[k]; ok {
				k = parent
			}
			if model, ok := v.deviceModel[k]; ok && !held[k] {
				held[k] = true
				l.Free[model]--
			}
		}
		// A claim cannot take more GPUs than the fleet has.
		if p := c.pending; p != nil && v.usedByOwner(p) && min(p.devices, published) > 0 {
			l.Pending = append(l.Pending, rewrite.Pending{Devices: min(p.devices, published), BoundType: v.boundTypes[p.profile]})
		}
	}
	v.load = l
	return l
}

// OnAdd records a slice, a claim, a profile's bound type or the claims
// made for a pod.
func (v *View) OnAdd(obj any, _ bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		if o.Spec.Driver != gpuv1alpha1.DriverName {
			return
		}
		v.slices[o.UID] = summarise(o)
		v.publish()
	case *resourceapi.ResourceClaim:
		v.claims[o.UID] = summariseClaim(o)
		v.load = nil
	case *prismv1alpha1.WorkloadProfile:
		v.setBoundType(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, o.Status.BoundType)
	case *corev1.Pod:
		v.setPod(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, summarisePod(o))
	}
}

// OnUpdate records a slice's new devices, a claim's new allocation, a
// profile's new measurement or a pod's new claims.
func (v *View) OnUpdate(_, obj any) { v.OnAdd(obj, false) }

// OnDelete forgets a slice, a claim, a profile or a pod.
func (v *View) OnDelete(obj any) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		if _, known := v.slices[o.UID]; known {
			delete(v.slices, o.UID)
			v.publish()
		}
	case *resourceapi.ResourceClaim:
		delete(v.claims, o.UID)
		v.load = nil
	case *prismv1alpha1.WorkloadProfile:
		v.setBoundType(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, "")
	case *corev1.Pod:
		v.forgetPod(types.NamespacedName{Namespace: o.Namespace, Name: o.Name})
	}
}

// setBoundType records a profile's bound type; the load is rebuilt only
// when it changed, not on every status update of a profile.
func (v *View) setBoundType(profile types.NamespacedName, b prismv1alpha1.BoundType) {
	if v.boundTypes[profile] == b {
		return
	}
	if b == "" {
		delete(v.boundTypes, profile)
	} else {
		v.boundTypes[profile] = b
	}
	v.load = nil
}

// publish merges the slices into a new Fleet. Only the newest generation of
// each pool counts: the plugin replaces a pool's slices by publishing a
// higher generation, and the old ones linger until they are deleted.
func (v *View) publish() {
	newest := map[string]int64{}
	for _, s := range v.slices {
		newest[s.pool] = max(newest[s.pool], s.generation)
	}
	var current []sliceSummary
	for _, s := range v.slices {
		if s.generation == newest[s.pool] {
			current = append(current, s)
		}
	}
	nodeModels := map[string]map[string]int{} // node -> model -> devices
	// A pool may put partitions and their GPUs in different slices.
	gpuByUUID := map[string]map[string]string{} // pool -> uuid -> device
	for _, s := range current {
		if nodeModels[s.node] == nil {
			nodeModels[s.node] = map[string]int{}
		}
		for name, m := range s.models {
			nodeModels[s.node][name] += m.Devices
		}
		if gpuByUUID[s.pool] == nil {
			gpuByUUID[s.pool] = map[string]string{}
		}
		maps.Copy(gpuByUUID[s.pool], s.uuids)
	}
	models := map[string]rewrite.Model{}
	partitions := map[partitionKey]rewrite.PartitionModel{}
	v.deviceModel = map[deviceKey]string{}
	v.partitionParent = map[deviceKey]deviceKey{}
	for _, s := range current {
		for name, m := range s.models {
			if len(nodeModels[s.node]) > 1 {
				m.MixedDevices = m.Devices
			}
			models[name] = merge(models[name], m)
		}
		for device, model := range s.devices {
			v.deviceModel[deviceKey{s.pool, device}] = model
		}
		for device, uuid := range s.parents {
			if parent, ok := gpuByUUID[s.pool][uuid]; ok {
				v.partitionParent[deviceKey{s.pool, device}] = deviceKey{s.pool, parent}
			}
		}
		for k, p := range s.partitions {
			partitions[k] = mergePartition(partitions[k], p)
		}
	}
	f := &rewrite.Fleet{Models: make([]rewrite.Model, 0, len(models))}
	for _, m := range models {
		f.Models = append(f.Models, m)
	}
	slices.SortFunc(f.Models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	for _, p := range partitions {
		f.Partitions = append(f.Partitions, p)
	}
	slices.SortFunc(f.Partitions, func(a, b rewrite.PartitionModel) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Profile, b.Profile))
	})
	v.nodeModels = map[string][]string{}
	for node, ms := range nodeModels {
		if len(ms) > 0 {
			v.nodeModels[node] = slices.Sorted(maps.Keys(ms))
		}
	}
	v.fleet.Store(f)
	v.load = nil
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// merge adds b's devices to a. Devices of one model publish the same
// figures unless their clocks differ (a power-capped board, another
// firmware); the model then counts with its slowest devices, so that a
// threshold cut from it admits every one of them.
func merge(a, b rewrite.Model) rewrite.Model {
	if a.Devices == 0 {
		return b
	}
	a.Devices += b.Devices
	a.MixedDevices += b.MixedDevices
	a.SharedDevices += b.SharedDevices
	a.FigureCapacityDevices += b.FigureCapacityDevices
	a.BandwidthGBps = minKnown(a.BandwidthGBps, b.BandwidthGBps)
	a.FP32GFLOPS = minKnown(a.FP32GFLOPS, b.FP32GFLOPS)
	a.MemoryBytes = max(a.MemoryBytes, b.MemoryBytes)
	a.Multiprocessors = minKnown(a.Multiprocessors, b.Multiprocessors)
	return a
}

// mergePartition adds b's devices to a; the profile counts with its
// smallest figures, so that a partition chosen from them holds what it
// was chosen for on every GPU.
func mergePartition(a, b rewrite.PartitionModel) rewrite.PartitionModel {
	if a.Devices == 0 {
		return b
	}
	a.Devices += b.Devices
	a.MemoryBytes = minKnown(a.MemoryBytes, b.MemoryBytes)
	a.Multiprocessors = minKnown(a.Multiprocessors, b.Multiprocessors)
	return a
}

// minKnown is the smaller figure, zero (not published) counting as unknown.
func minKnown(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

func summarise(s *resourceapi.ResourceSlice) sliceSummary {
	node := s.Spec.Pool.Name
	if s.Spec.NodeName != nil && *s.Spec.NodeName != "" {
		node = *s.Spec.NodeName
	}
	sum := sliceSummary{pool: s.Spec.Pool.Name, node: node, generation: s.Spec.Pool.Generation, models: map[string]rewrite.Model{}, devices: map[string]string{},
		uuids: map[string]string{}, parents: map[string]string{}, partitions: map[partitionKey]rewrite.PartitionModel{}}
	for _, d := range s.Spec.Devices {
		name := stringAttr(d, gpuv1alpha1.ProductNameAttribute)
		if name == "" {
			continue
		}
		if profile := stringAttr(d, gpuv1alpha1.MIGProfileAttribute); profile != "" {
			// A partition is not a GPU of its model: counting it would add
			// devices and, through minKnown, a partition's figures.
			p := rewrite.PartitionModel{Model: name, Profile: profile, Devices: 1, Multiprocessors: intAttr(d, gpuv1alpha1.MultiprocessorCountAttribute)}
			if q, ok := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
				p.MemoryBytes = q.Value.Value()
			}
			k := partitionKey{name, profile}
			sum.partitions[k] = mergePartition(sum.partitions[k], p)
			if parent := stringAttr(d, gpuv1alpha1.ParentUUIDAttribute); parent != "" {
				sum.parents[d.Name] = parent
			}
			continue
		}
		m := rewrite.Model{Name: name, Devices: 1, BandwidthGBps: intAttr(d, gpuv1alpha1.MemoryBandwidthGBpsAttribute), FP32GFLOPS: intAttr(d, gpuv1alpha1.FP32GFLOPSAttribute),
			Multiprocessors: intAttr(d, gpuv1alpha1.MultiprocessorCountAttribute)}
		if q, ok := d.Capacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
			m.MemoryBytes = q.Value.Value()
		}
		if d.AllowMultipleAllocations != nil && *d.AllowMultipleAllocations {
			m.SharedDevices = 1
		}
		if publishesFiguresAsCapacity(d, m) {
			m.FigureCapacityDevices = 1
		}
		sum.models[name] = merge(sum.models[name], m)
		sum.devices[d.Name] = name
		if uuid := stringAttr(d, gpuv1alpha1.UUIDAttribute); uuid != "" {
			sum.uuids[uuid] = d.Name
		}
	}
	return sum
}

// publishesFiguresAsCapacity says whether the device publishes every figure
// it has as a capacity too, which a bound written as a capacity request
// needs (rewrite.TierBoundsAsCapacity). A compute capability the plugin
// cannot write as an sm_XY number leaves smVersion out, and then the device
// does not count.
func publishesFiguresAsCapacity(d resourceapi.Device, m rewrite.Model) bool {
	_, hasCC := attribute(d, gpuv1alpha1.CUDAComputeCapabilityAttribute)
	for name, has := range map[resourceapi.QualifiedName]bool{
		gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified(): m.BandwidthGBps > 0,
		gpuv1alpha1.FP32GFLOPSCapacity.Qualified():          m.FP32GFLOPS > 0,
		gpuv1alpha1.SMVersionCapacity.Qualified():           hasCC,
	} {
		if _, ok := d.Capacity[name]; has && !ok {
			return false
		}
	}
	return true
}

// summariseClaim reads the devices a claim holds, or what a claim that a
// pod owns waits for: the GPUs its Prism requests ask for (a
// firstAvailable request by its first alternative), at most
// maxPendingDevices, the profile it names and the pod. Its
// prism.dev/rewrite annotation is its owner's to write, so the bound type
// is taken from the profile instead.
func summariseClaim(c *resourceapi.ResourceClaim) claimSummary {
	if a := c.Status.Allocation; a != nil {
		var held []deviceKey
		for _, r := range a.Devices.Results {
			if r.Driver == gpuv1alpha1.DriverName {
				held = append(held, deviceKey{r.Pool, r.Device})
			}
		}
		return claimSummary{held: held}
	}
	owner := podOwner(c)
	if owner == nil {
		return claimSummary{}
	}
	devices := int64(0)
	for _, r := range c.Spec.Devices.Requests {
		class, mode, count := "", resourceapi.DeviceAllocationMode(""), int64(0)
		switch {
		case r.Exactly != nil:
			class, mode, count = r.Exactly.DeviceClassName, r.Exactly.AllocationMode, r.Exactly.Count
		case len(r.FirstAvailable) > 0:
			class, mode, count = r.FirstAvailable[0].DeviceClassName, r.FirstAvailable[0].AllocationMode, r.FirstAvailable[0].Count
		}
		if rewrite.IsGPUClass(class) && mode != resourceapi.DeviceAllocationModeAll {
			// Bounded before the sum, which counts of any size would
			// overflow.
			devices = min(devices+min(max(count, 1), maxPendingDevices), maxPendingDevices)
		}
	}
	if devices == 0 {
		return claimSummary{}
	}
	p := &pendingClaim{devices: int(devices), claim: c.Name, pod: types.NamespacedName{Namespace: c.Namespace, Name: owner.Name}, podUID: owner.UID}
	if name, _ := prismv1alpha1.ProfileName(c.Annotations); name != "" {
		p.profile = types.NamespacedName{Namespace: c.Namespace, Name: name}
	}
	return claimSummary{pending: p}
}

// podOwner returns the claim's controlling owner where that is a pod. The
// resourceclaim controller of kube-controller-manager makes a pod the
// controlling owner of each claim it makes from the pod's claim templates;
// reservedFor, the other tie to a pod, is only ever set with an
// allocation. Whoever creates a claim can write any ownerReference, so the
// pod must also name the claim in its status (View.usedByOwner). A claim
// made by hand and named by a pod's resourceClaimName has neither while it
// waits, and does not count.
func podOwner(c *resourceapi.ResourceClaim) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(c)
	if ref == nil || ref.APIVersion != "v1" || ref.Kind != "Pod" {
		return nil
	}
	return ref
}

// summarisedAttributes are the device attributes summarise reads.
var summarisedAttributes = []gpuv1alpha1.AttributeName{
	gpuv1alpha1.ProductNameAttribute, gpuv1alpha1.MemoryBandwidthGBpsAttribute, gpuv1alpha1.FP32GFLOPSAttribute, gpuv1alpha1.CUDAComputeCapabilityAttribute,
	gpuv1alpha1.MIGProfileAttribute, gpuv1alpha1.MultiprocessorCountAttribute, gpuv1alpha1.UUIDAttribute, gpuv1alpha1.ParentUUIDAttribute,
}

// TrimSlice is the transform for the ResourceSlice informer that feeds the
// View: it keeps what summarise reads (the pool, the node, and of each
// device its name, the attributes summarisedAttributes names, its
// capacities and whether it may be shared). A device publishes 20
// attributes and the view reads 8: at 5,000 nodes of 8 GPUs the whole
// slices held about 266 MiB in the informer's store.
func TrimSlice(obj any) (any, error) {
	s, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, UID: s.UID, ResourceVersion: s.ResourceVersion},
		Spec:       resourceapi.ResourceSliceSpec{Driver: s.Spec.Driver, Pool: s.Spec.Pool, NodeName: s.Spec.NodeName},
	}
	out.Spec.Devices = make([]resourceapi.Device, len(s.Spec.Devices))
	for i, d := range s.Spec.Devices {
		t := resourceapi.Device{Name: d.Name, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations,
			Attributes: make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, len(summarisedAttributes))}
		for _, id := range summarisedAttributes {
			for _, key := range []resourceapi.QualifiedName{id.Qualified(), resourceapi.QualifiedName(id)} {
				if a, ok := d.Attributes[key]; ok {
					t.Attributes[key] = a
					break
				}
			}
		}
		out.Spec.Devices[i] = t
	}
	return out, nil
}

// attribute looks a Prism attribute up by its qualified name, and by its
// short name, which the API treats as being in the driver's domain.
func attribute(d resourceapi.Device, id gpuv1alpha1.AttributeName) (resourceapi.DeviceAttribute, bool) {
	if a, ok := d.Attributes[id.Qualified()]; ok {
		return a, true
	}
	a, ok := d.Attributes[resourceapi.QualifiedName(id)]
	return a, ok
}

func stringAttr(d resourceapi.Device, id gpuv1alpha1.AttributeName) string {
	if a, ok := attribute(d, id); ok && a.StringValue != nil {
		return *a.StringValue
	}
	return ""
}

func intAttr(d resourceapi.Device, id gpuv1alpha1.AttributeName) int64 {
	if a, ok := attribute(d, id); ok && a.IntValue != nil {
		return *a.IntValue
	}
	return 0
}
