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

package profilewrites

import (
	"slices"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/tools/cache"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// claimMemory is how long a profile stays writable by a node after the
// last claim naming it left that node. The plugin publishes at unprepare,
// after the pod has stopped; by then the claim may already be deallocated
// or deleted, and collection itself takes a while.
const claimMemory = 10 * time.Minute

// ProfileClaims remembers which nodes run claims that name which
// WorkloadProfiles: key (namespace, profile, node) is present while a
// ResourceClaim in namespace annotated with the profile is allocated a
// Prism GPU on node, and for claimMemory after. It is a
// cache.ResourceEventHandler for a ResourceClaim informer.
type ProfileClaims struct {
	now func() time.Time

	mu     sync.Mutex
	claims map[types.UID][]profileClaimKey
	live   map[profileClaimKey]int
	left   map[profileClaimKey]time.Time // when the last claim went
}

type profileClaimKey struct {
	namespace, profile, node string
}

// NewProfileClaims returns an empty ProfileClaims.
func NewProfileClaims() *ProfileClaims {
	return &ProfileClaims{
		now:    time.Now,
		claims: make(map[types.UID][]profileClaimKey),
		live:   make(map[profileClaimKey]int),
		left:   make(map[profileClaimKey]time.Time),
	}
}

// OnAdd records a claim.
func (p *ProfileClaims) OnAdd(obj any, _ bool) {
	if c, ok := obj.(*resourceapi.ResourceClaim); ok {
		p.set(c.UID, profileClaimKeys(c))
	}
}

// OnUpdate records a claim's new allocation or annotation.
func (p *ProfileClaims) OnUpdate(_, obj any) {
	p.OnAdd(obj, false)
}

// OnDelete forgets a claim, after claimMemory.
func (p *ProfileClaims) OnDelete(obj any) {
	if tomb, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if c, ok := obj.(*resourceapi.ResourceClaim); ok {
		p.set(c.UID, nil)
	}
}

// Writable tells whether node runs, or ran within claimMemory, a claim in
// namespace that names profile.
func (p *ProfileClaims) Writable(namespace, profile, node string) bool {
	k := profileClaimKey{namespace: namespace, profile: profile, node: node}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live[k] > 0 {
		return true
	}
	left, ok := p.left[k]
	return ok && p.now().Sub(left) < claimMemory
}

func (p *ProfileClaims) set(uid types.UID, keys []profileClaimKey) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for k, t := range p.left {
		if now.Sub(t) >= claimMemory {
			delete(p.left, k)
		}
	}
	old := p.claims[uid]
	for _, k := range old {
		if slices.Contains(keys, k) {
			continue
		}
		if p.live[k]--; p.live[k] <= 0 {
			delete(p.live, k)
			p.left[k] = now
		}
	}
	for _, k := range keys {
		if !slices.Contains(old, k) {
			p.live[k]++
		}
	}
	if len(keys) == 0 {
		delete(p.claims, uid)
	} else {
		p.claims[uid] = keys
	}
}

// TrimClaim is the transform for the ResourceClaim informer that feeds
// ProfileClaims: it keeps only what ProfileClaims reads, so that caching
// every claim of the cluster costs little memory.
func TrimClaim(obj any) (any, error) {
	c, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return obj, nil
	}
	out := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: c.Name, Namespace: c.Namespace, UID: c.UID, ResourceVersion: c.ResourceVersion}}
	// Only a valid name is kept: the value is the claim's author's, up to
	// the API's 256 KiB of annotations, and an invalid one names no profile
	// to any reader of the cache.
	if p, _ := prismv1alpha1.ProfileName(c.Annotations); p != "" {
		out.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: p}
	}
	if c.Status.Allocation == nil {
		keepPending(c, out)
	}
	if a := c.Status.Allocation; a != nil {
		out.Status.Allocation = &resourceapi.AllocationResult{}
		for _, r := range a.Devices.Results {
			out.Status.Allocation.Devices.Results = append(out.Status.Allocation.Devices.Results,
				resourceapi.DeviceRequestAllocationResult{Driver: r.Driver, Pool: r.Pool, Device: r.Device, Request: r.Request})
		}
	}
	return out, nil
}

// maxCachedPlan bounds the prism.dev/rewrite plan the cache keeps of a
// waiting claim.
const maxCachedPlan = 16 << 10

// keepPending keeps what is read of a claim that waits for devices: its
// rewrite plan (for the pods that name it, see podaffinity), and for the
// fleet view's load how many devices of which class it asks for and the
// pod whose template made it (its controlling owner), since a claim no pod
// uses does not count (see fleet.View). Once allocated, a claim drops them
// again.
func keepPending(c, out *resourceapi.ResourceClaim) {
	// The plan is the webhook's, but the claim's author can edit it on a
	// claim that never gets allocated: one the webhook did not write (its
	// plans are under 1 KiB) is not kept, so that the cache holds a
	// bounded amount per claim.
	if plan, ok := c.Annotations[rewrite.AnnotationKey]; ok && len(plan) <= maxCachedPlan {
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
}

// profileClaimKeys returns the nodes a claim names its profile on. The
// plugin names its pool after its node, and prepares only results of that
// pool.
func profileClaimKeys(c *resourceapi.ResourceClaim) []profileClaimKey {
	profile, _ := prismv1alpha1.ProfileName(c.Annotations)
	if profile == "" || c.Status.Allocation == nil {
		return nil
	}
	nodes := sets.New[string]()
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == gpuv1alpha1.DriverName {
			nodes.Insert(r.Pool)
		}
	}
	keys := make([]profileClaimKey, 0, nodes.Len())
	for _, n := range sets.List(nodes) {
		keys = append(keys, profileClaimKey{namespace: c.Namespace, profile: profile, node: n})
	}
	return keys
}

var _ cache.ResourceEventHandler = (*ProfileClaims)(nil)
