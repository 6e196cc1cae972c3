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

import (
	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// tier is one alternative of a generated firstAvailable list.
type tier struct {
	name string
	// selectors are the tier's own tests, before the hard needs; none:
	// hard needs only.
	selectors []selectorID
	reason    string
	// models are the fleet's models the tier test selects; only fleet-cut
	// tiers know them (see NodePreference).
	models []string
	// bound is the tier test as a lower bound on one figure, where it is
	// nothing else, so that a capacity request can carry it instead of the
	// selector (see TierBoundsAsCapacity); nil: CEL only.
	bound *lowerBound
	// share is the share of one GPU the tier asks for, as capacity
	// requests; nil: whole GPUs.
	share *gpuv1alpha1.Share
	// partition is the MIG profile the tier asks for, of class
	// MIGDeviceClassName; "": a whole GPU or a share of one.
	partition string
}

// lowerBound is the tier test "fig >= at".
type lowerBound struct {
	fig figure
	at  int64
}

// fits is the last tier of every ladder: hard needs and user selectors only,
// so the rewritten request matches every device the plain request matched,
// minus those that cannot hold the workload.
var fits = tier{name: "fits", reason: "hard needs only: never less schedulable than the plain claim"}

// preferred is the ladder without its fits tier.
func preferred(ladder []tier) []tier {
	out := make([]tier, 0, len(ladder))
	for _, t := range ladder {
		if t.name != fits.name {
			out = append(out, t)
		}
	}
	return out
}

// ladders holds the tiers per bound type and policy.
//
// A tier that fails on a node costs a scan of all its devices with two CEL
// evaluations each (class selector, tier test), about 16 times what a plain
// claim pays on a node it accepts. So every ladder is one preferred tier plus
// fits, except memory-bound performance: there the middle step (A100 against
// GDDR cards) is a 2-7x difference in the bottleneck resource, worth one more
// failing scan on GDDR nodes.
var ladders = map[prismv1alpha1.BoundType]map[prismv1alpha1.Policy][]tier{
	prismv1alpha1.BoundTypeMemoryBound: {
		prismv1alpha1.PolicyPerformance: {
			{"ultra", []selectorID{selBandwidthUltra}, "bandwidth class ultra (>2500 GB/s): H100, H200", nil, nil, nil, ""},
			{"high", []selectorID{selBandwidthHigh}, "bandwidth class high (1200-2500 GB/s): A100", nil, nil, nil, ""},
			fits,
		},
		prismv1alpha1.PolicyEconomy: {
			{"high", []selectorID{selBandwidthHigh}, "bandwidth class high: HBM without taking ultra devices", nil, nil, nil, ""},
			fits,
		},
	},
	prismv1alpha1.BoundTypeComputeBound: {
		prismv1alpha1.PolicyPerformance: {
			{"fp32-fast", []selectorID{selFP32Fast}, "fp32 >= 60 TFLOPS: L40S, RTX 4090, H100, H200", nil, nil, nil, ""},
			fits,
		},
		prismv1alpha1.PolicyEconomy: {
			{"fp32-value", []selectorID{selFP32Value}, "low/mid bandwidth class with fp32 >= 25 TFLOPS: L4, A10, L40S", nil, nil, nil, ""},
			fits,
		},
	},
	prismv1alpha1.BoundTypeLatencyBound: {
		prismv1alpha1.PolicyPerformance: {
			{"fp32-fast", []selectorID{selFP32Fast}, "fp32 >= 60 TFLOPS: L40S, RTX 4090, H100, H200", nil, nil, nil, ""},
			fits,
		},
		prismv1alpha1.PolicyEconomy: {
			{"low", []selectorID{selBandwidthLow}, "bandwidth class low: smallest cards (L4, T4), keeps big ones free", nil, nil, nil, ""},
			fits,
		},
	},
}

// ladder picks the tiers for a bound type and policy: cut from the fleet
// when one is known, else the built-in ladders, which assume a fleet that
// spans the bandwidth classes the plugin publishes. The strings say which
// fleet figures chose the cut and what the load-aware policy decided.
func (c Cluster) ladder(bound prismv1alpha1.BoundType, policy prismv1alpha1.Policy, spec *resourceapi.ResourceClaimSpec, n needs, busy map[string]int64) ([]tier, string, string) {
	if !c.FleetKnown {
		if policy == prismv1alpha1.PolicyLoadAware {
			return ladders[bound][prismv1alpha1.PolicyPerformance], "", "performance: no fleet known"
		}
		return ladders[bound][policy], "", ""
	}
	fleet := fitting(c.Fleet, n)
	var t []tier
	var cut, load string
	if policy == prismv1alpha1.PolicyLoadAware {
		t, cut, load = loadAwareLadder(fleet, c.Load, bound, requestedDevices(spec))
	} else {
		t, cut = fleetLadder(fleet, bound, policy)
	}
	if policy != prismv1alpha1.PolicyEconomy {
		// Economy keeps the top class free on purpose, however fast the
		// workload ran there.
		t = measuredFirst(t, fleet, bound, busy)
	}
	if t == nil && n.text != "" && c.Fleet != nil && len(c.Fleet.Models) > 0 {
		// No preference to express, but hard needs to keep: a claim left
		// as written could land on a GPU too small for the workload.
		return []tier{fits}, cut, load
	}
	return t, cut, load
}
