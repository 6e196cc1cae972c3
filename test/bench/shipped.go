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

package bench

import "github.com/prismgpu/prism/pkg/rewrite"

// What the chart ships, which the summary's rewrite rows lead with
// (TestShippedIsTheChartDefault holds these to the chart's values).
const (
	// ShippedForm is the form the controller writes a profile's memory
	// floor and its tiers' lower bounds in: the chart's rewrite.memoryFloor
	// and the controller's --memory-floor. In the capacity form the
	// webhook writes both as capacity requests (rewrite.MemoryFloorAsCapacity
	// and rewrite.TierBoundsAsCapacity), on fleets without shareable GPUs
	// (the chart's sharing.consumableCapacity is off).
	ShippedForm = rewrite.FormCapacity
	// ShippedFiguresAsCapacity is whether the chart's plugin publishes the
	// tier figures as capacities (kubeletPlugin.figuresAsCapacity, the
	// plugin's --figures-as-capacity), which the tier bounds in the
	// capacity form need.
	ShippedFiguresAsCapacity = true
	// ShippedPreference is how the chart's controller writes a profile's
	// preference (rewrite.preference, --preference): a ladder of tiers.
	ShippedPreference = rewrite.PreferLadder
)
