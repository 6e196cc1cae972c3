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

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/prismgpu/prism/internal/controller/fleet"
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
// cache.ResourceEventHandler for a ResourceClaim informer (claims as
// fleet.TrimClaim makes them, or whole).
type ProfileClaims struct {
	now func() time.Time

	mu sync.Mutex
	// claims are the claims that name their profile on a node, by
	// namespace and name, as the informer's store keys them: a claim made
	// again under its name while the watch was down comes as an update,
	// and takes the place of the one it replaced.
	claims map[types.NamespacedName]*fleet.Claim
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
		claims: make(map[types.NamespacedName]*fleet.Claim),
		live:   make(map[profileClaimKey]int),
		left:   make(map[profileClaimKey]time.Time),
	}
}

// OnAdd records a claim.
func (p *ProfileClaims) OnAdd(obj any, _ bool) {
	if c, ok := fleet.ClaimOf(obj); ok {
		p.set(c.NamespacedName(), c)
	}
}

// OnUpdate records a claim's new allocation or annotation.
func (p *ProfileClaims) OnUpdate(_, obj any) {
	p.OnAdd(obj, false)
}

// OnDelete forgets a claim, after claimMemory.
func (p *ProfileClaims) OnDelete(obj any) {
	if c, ok := fleet.ClaimOf(obj); ok {
		p.set(c.NamespacedName(), nil)
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

// set records the claim in place of the one of its name; nil forgets it.
func (p *ProfileClaims) set(name types.NamespacedName, c *fleet.Claim) {
	keys := profileClaimKeys(c)
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	for k, t := range p.left {
		if now.Sub(t) >= claimMemory {
			delete(p.left, k)
		}
	}
	old := profileClaimKeys(p.claims[name])
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
		delete(p.claims, name)
	} else {
		p.claims[name] = c
	}
}

// profileClaimKeys returns the nodes a claim names its profile on; none
// for nil. The plugin names its pool after its node, and prepares only
// results of that pool.
func profileClaimKeys(c *fleet.Claim) []profileClaimKey {
	if c == nil || c.Profile() == "" {
		return nil
	}
	var keys []profileClaimKey
	for _, node := range c.Pools() {
		keys = append(keys, profileClaimKey{namespace: c.NamespacedName().Namespace, profile: c.Profile(), node: node})
	}
	return keys
}

var _ cache.ResourceEventHandler = (*ProfileClaims)(nil)
