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

package v1alpha1

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// shareCapacities are the capacities a GPU published shareable lets several
// claims take amounts of, in the order messages name them.
var shareCapacities = []CapacityName{ComputeCapacity, MemoryCapacity}

// SharedCapacities lists the capacities of a shareable GPU that a request's
// capacity requirements name an amount of. A request that names any asks
// for a share of a GPU: on a GPU published shareable the amount is what the
// claim takes, and the rest is left to other claims. This is where a
// request is judged a share before it is allocated: the validating webhook
// refuses a GpuConfig that a share cannot take on such a request, and the
// rewrite writes no such amount for a request that has one. A memory amount
// is only a floor on a GPU that is not shareable, but the scheduler may give
// the request either kind of GPU, so it counts.
func SharedCapacities(c *resourceapi.CapacityRequirements) []CapacityName {
	if c == nil {
		return nil
	}
	var out []CapacityName
	for _, n := range shareCapacities {
		if _, ok := c.Requests[n.Qualified()]; ok {
			out = append(out, n)
		}
	}
	return out
}

// ShareConflict says why a share of a GPU cannot run under strategy s, or
// nil where it can. A share runs beside other claims' shares on one GPU and
// is enforced by MPS, so its one strategy is Exclusive, the default: the
// share is its claim's containers' alone. TimeSlicing would leave MPS, and
// the share's limits with it, and set the time slice of the whole GPU,
// which the other shares run under. A strategy added later conflicts until
// its meaning for a share is defined here.
func (s SharingStrategy) ShareConflict() error {
	switch s {
	case "", ExclusiveSharing:
		return nil
	case TimeSlicingSharing:
		return errors.New("a share cannot be time-sliced: MPS enforces it, and a time slice is set for the whole GPU, which other claims' shares run on")
	}
	return fmt.Errorf("a share of a GPU is enforced by MPS and cannot take sharing.strategy %q", s)
}
