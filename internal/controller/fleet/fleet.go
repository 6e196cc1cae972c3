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
// template made it: the pod is its controlling owner (which TrimClaim
// keeps), and the pod's status, which kube-controller-manager writes and
// the tenant cannot, names the claim. A claim made by hand, or with an ownerReference its creator pointed at a
// pod, counts only once it is allocated, when it holds devices. A waiting
// claim counts with at most maxPendingDevices GPUs (never more than the
// fleet publishes), and with the bound type of the WorkloadProfile its
// prism.dev/profile annotation names in its namespace, never with the one
// its prism.dev/rewrite annotation states.
//
// The view is kept up to date on every event, at a cost that does not
// grow with the fleet: a slice's event recomputes only its node and pool,
// and moves the fleet's totals by the difference; a claim's moves the
// count of its devices. BenchmarkControllerScale measures what it holds
// and costs at 5,000 nodes, and BenchmarkControllerRSS the resident
// memory of a process that holds it.
package fleet

import (
	"sync"
	"sync/atomic"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// View is a cache.ResourceEventHandler for a ResourceSlice (slices as
// TrimSlice makes them, or whole), a ResourceClaim (claims as TrimClaim
// makes them, or whole), a WorkloadProfile and a Pod informer
// (UnscheduledPods, as TrimPod keeps them). Fleet and Load are
// safe to call from any goroutine; they are on the path of every admitted
// claim, so Fleet is one atomic load and Load is rebuilt only after a
// change, from the waiting claims and the models' counts.
type View struct {
	mu sync.Mutex
	published
	// holders are the claims that hold Prism devices, and waiting those
	// that count as waiting, by namespace and name, as the informer's
	// store keys them.
	holders map[types.NamespacedName]*Claim
	waiting map[types.NamespacedName]*Claim
	// held counts, per pool and device, the claims that hold it.
	held map[string]map[string]int
	// inUse counts, per GPU of a current pool generation, the held devices
	// that take it: the GPU itself and its MIG partitions.
	inUse map[deviceKey]int
	// busy counts, per model, its GPUs in use.
	busy map[string]int
	// boundTypes are the profiles' measured bound types; a profile without
	// one is not kept.
	boundTypes map[types.NamespacedName]prismv1alpha1.BoundType
	// pods are the unscheduled pods that claims were made for; a pod
	// without one is not kept.
	pods map[types.NamespacedName]podClaims
	load *rewrite.Load // nil: rebuild on the next Load
	// changed is signalled, without blocking, when the fleet changes.
	changed chan struct{}

	fleet atomic.Pointer[rewrite.Fleet]
}

// NewView returns a View of an empty fleet.
func NewView() *View {
	v := &View{published: newPublished(), holders: map[types.NamespacedName]*Claim{}, waiting: map[types.NamespacedName]*Claim{}, held: map[string]map[string]int{}, inUse: map[deviceKey]int{},
		busy: map[string]int{}, boundTypes: map[types.NamespacedName]prismv1alpha1.BoundType{}, pods: map[types.NamespacedName]podClaims{}, changed: make(chan struct{}, 1)}
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
	out := make(map[string][]string, len(v.nodes))
	for n, s := range v.nodes {
		if names := s.modelNames(); len(names) > 0 {
			out[n] = names
		}
	}
	return out
}

// OnAdd records a slice, a claim, a profile's bound type or the claims
// made for a pod.
func (v *View) OnAdd(obj any, _ bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch o := obj.(type) {
	case *resourceapi.ResourceSlice:
		v.setSlice(o.Name, summarise(o))
	case *Slice:
		v.setSlice(o.name, o)
	case *resourceapi.ResourceClaim:
		v.setClaim(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, trimClaim(o))
	case *Claim:
		v.setClaim(o.NamespacedName(), o)
	case *prismv1alpha1.WorkloadProfile:
		v.setBoundType(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, o.Status.BoundType)
	case *corev1.Pod:
		v.setPod(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, summarisePod(o))
	}
}

// OnUpdate records a slice's new devices, a claim's new allocation, a
// profile's new measurement or a pod's new claims. The informer keys each
// by name: an object deleted and made again under its name while the
// watch was down comes as an update, and replaces the old one here too.
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
		v.setSlice(o.Name, nil)
	case *Slice:
		v.setSlice(o.name, nil)
	case *resourceapi.ResourceClaim:
		v.setClaim(types.NamespacedName{Namespace: o.Namespace, Name: o.Name}, nil)
	case *Claim:
		v.setClaim(o.NamespacedName(), nil)
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
