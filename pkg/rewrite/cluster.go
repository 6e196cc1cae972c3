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

package rewrite

// Cluster is what the cluster offers the claims Rewrite writes: the
// profile says what a workload needs, the Cluster what it may get.
// prism-controller decides Capacity, Preference and Partitions once, from
// its flags and the API server's answer to the capacity probe, and takes
// Fleet, Load and ExactlyOnly from its informers for each claim.
type Cluster struct {
	// Capacity is whether a claim may carry capacity requests, and why.
	Capacity Capacity
	// Preference is how a preference reaches the scheduler (see
	// WithPreference). Empty: ladders, and the plan names no mode.
	Preference PreferenceMode
	// Partitions offers a request for one whole GPU a MIG partition first
	// where Fleet publishes partitions (see PartitionsFromUsage).
	Partitions bool
	// FleetKnown says that Fleet is the fleet as published, which the
	// ladders are cut from: a nil or empty one gives no preference.
	// Without it the built-in ladders apply (see WithFleet).
	FleetKnown bool
	Fleet      *Fleet
	// Load is the load-aware policy's view of the fleet (see WithLoad);
	// nil: load-aware behaves as performance.
	Load *Load
	// ExactlyOnly names the scheduler of the claim's pod where it counts a
	// claim's GPUs only from exactly requests (KAI-Scheduler, see
	// exactly.go): the claim gets no ladder. Empty: the pod's scheduler
	// counts firstAvailable requests, or the claim has no pod.
	ExactlyOnly string
}

// Capacity is the decision whether claims may carry capacity requests,
// made once from the controller's --memory-floor and the API server's
// answer to a dry-run claim (claimrewrite.MemoryFloorProbe): an API server
// without DRAConsumableCapacity drops them. What the kubelet plugins
// publish (GPUs shareable, figures as capacities) reaches the rewrite in
// the fleet and is decided for each claim: the plan's memoryFloor and
// tierBounds say how.
type Capacity struct {
	// Shares offers a request for one whole GPU a share sized from its
	// profile's usage first (see ShareFromUsage).
	Shares bool
	// MemoryFloor asks for the memory floor as a capacity request (see
	// MemoryFloorAsCapacity).
	MemoryFloor bool
	// TierBounds asks for the tiers' lower bounds and the compute
	// capability floor as capacity requests (see TierBoundsAsCapacity).
	TierBounds bool
	// Why says how the decision was made; the plan's capacity reports it.
	// Empty: the plan says nothing (a caller that set the fields itself).
	Why string
}

// choice is the decision as the plan reports it: the form asked for, and
// why.
func (c Capacity) choice() FormChoice {
	if c.Why == "" {
		return FormChoice{}
	}
	if c.MemoryFloor || c.TierBounds {
		return FormChoice{Form: FormCapacity, Why: c.Why}
	}
	return celBecause("%s", c.Why)
}

// Option changes how Rewrite writes a claim for the cluster it serves. A
// Cluster is one and sets every field; the other options set one field
// each, for callers that need no more.
type Option interface {
	apply(*Cluster)
}

func (c Cluster) apply(to *Cluster) { *to = c }

type optionFunc func(*Cluster)

func (f optionFunc) apply(c *Cluster) { f(c) }

// clusterOf applies opts, in order, to the empty Cluster.
func clusterOf(opts []Option) Cluster {
	var c Cluster
	for _, opt := range opts {
		opt.apply(&c)
	}
	return c
}

// WithFleet makes Rewrite cut its ladders from the published fleet instead
// of the built-in ones. A nil fleet, or one with fewer than two models that
// differ in the figure a workload depends on, gives no preference: the
// claim is left unchanged.
func WithFleet(f *Fleet) Option {
	return optionFunc(func(c *Cluster) {
		c.FleetKnown = true
		c.Fleet = f
	})
}
