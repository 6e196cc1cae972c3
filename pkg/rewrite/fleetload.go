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
	"fmt"
	"math"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Load is the fleet's state at admission, as prism-controller sees it.
type Load struct {
	// Free is the number of unallocated devices per model name.
	Free map[string]int `json:"free,omitempty"`
	// Pending are the Prism GPU claims waiting for an allocation.
	Pending []Pending `json:"pending,omitempty"`
}

// Pending is a claim waiting for devices.
type Pending struct {
	// Devices is how many GPUs it asks for in all.
	Devices int `json:"devices"`
	// BoundType is that of the profile its prism.dev/profile annotation
	// names; empty for a claim nobody profiled.
	BoundType prismv1alpha1.BoundType `json:"boundType,omitempty"`
}

// WithLoad gives the load-aware policy its view of free devices and pending
// claims. Without it, load-aware behaves as performance.
func WithLoad(l *Load) Option {
	return optionFunc(func(c *Cluster) { c.Load = l })
}

// moreGain is how much more a pending claim must gain from the scarce class
// than the job being admitted before the job yields it: equal gains keep
// first come, first served.
const moreGain = 1.1

// loadAwareLadder is performance, unless the top class is contended by
// claims that need it more:
//   - a single-GPU job yields it while multi-GPU claims are pending and the
//     class has no more free devices than they ask for, so that it does not
//     break up the devices a multi-GPU claim needs on one node;
//   - any job yields it while claims that gain at least moreGain times more
//     from it (their figure on the class over their figure on the best
//     model outside it) are pending for at least its free devices.
//
// Yielding means preferring the second class; fits keeps the top class as
// the last resort, so the job is never less schedulable than under
// performance.
func loadAwareLadder(fleet *Fleet, load *Load, bound prismv1alpha1.BoundType, devices int) ([]tier, string, string) {
	perf, summary := fleetLadder(fleet, bound, prismv1alpha1.PolicyPerformance)
	if perf == nil {
		return perf, summary, "performance: no top class to yield"
	}
	if load == nil {
		return perf, summary, "performance: no load known"
	}
	c := cutFleet(fleet.Models, figureOf(bound))
	top := map[string]bool{}
	for _, m := range c.classes[0].models {
		top[m.Name] = true
	}
	free := 0
	for name := range top {
		free += load.Free[name]
	}
	own := gain(fleet, top, bound)
	multi, better := 0, 0
	for _, p := range load.Pending {
		if p.Devices >= 2 {
			multi += p.Devices
		}
		if gain(fleet, top, p.BoundType) >= own*moreGain {
			better += p.Devices
		}
	}
	names := strings.Join(modelNames(c.classes[0].models), ", ")
	var why string
	switch {
	case devices == 1 && multi > 0 && free <= multi:
		why = fmt.Sprintf("yields %s: %d devices of multi-GPU claims pending, %d free", names, multi, free)
	case better > 0 && free <= better:
		why = fmt.Sprintf("yields %s: %d devices pending for claims that gain more there (this job x%.2f), %d free", names, better, own, free)
	default:
		return perf, summary, fmt.Sprintf("takes %s: %d free, %d devices pending that gain more (this job x%.2f), %d of multi-GPU claims", names, free, better, own, multi)
	}
	second := tier{
		name:      tierName(c.fig, "yield"),
		selectors: []selectorID{c.below(0)},
		reason:    fmt.Sprintf("%s < %d %s: %s", c.fig.attribute(), c.threshold(0), c.fig.unit(), c.share(1, len(c.classes)-1)),
	}
	if len(c.classes) == 3 {
		second.selectors = []selectorID{c.atLeast(1), c.below(0)}
		second.reason = fmt.Sprintf("%s >= %d and < %d %s: %s", c.fig.attribute(), c.threshold(1), c.threshold(0), c.fig.unit(), c.share(1, 1))
	}
	return []tier{second, fits}, summary, why
}

func figureOf(bound prismv1alpha1.BoundType) figure {
	if bound == prismv1alpha1.BoundTypeMemoryBound {
		return figBandwidth
	}
	return figFP32
}

// gain is how much faster a workload of bound runs on the slowest model of
// top than on the fastest model outside it, by the figure that bounds it;
// 1 for workloads no figure speeds up.
func gain(fleet *Fleet, top map[string]bool, bound prismv1alpha1.BoundType) float64 {
	if bound != prismv1alpha1.BoundTypeMemoryBound && bound != prismv1alpha1.BoundTypeComputeBound {
		return 1
	}
	f := figureOf(bound)
	in, out := int64(math.MaxInt64), int64(0)
	for _, m := range fleet.Models {
		v := f.of(m)
		if v <= 0 || m.Devices <= 0 {
			continue
		}
		if top[m.Name] {
			in = min(in, v)
		} else {
			out = max(out, v)
		}
	}
	if out == 0 || in == math.MaxInt64 {
		return 1
	}
	return float64(in) / float64(out)
}

func modelNames(models []Model) []string {
	out := make([]string, len(models))
	for i, m := range models {
		out[i] = m.Name
	}
	return out
}

// requestedDevices is how many GPUs the spec's Prism requests ask for.
func requestedDevices(spec *resourceapi.ResourceClaimSpec) int {
	n := 0
	for _, r := range spec.Devices.Requests {
		if r.Exactly == nil || r.Exactly.DeviceClassName != DeviceClassName || r.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll {
			continue
		}
		n += int(max(r.Exactly.Count, 1))
	}
	return n
}
