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
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// MaxComputePercent is the whole GPU's compute: a share's ComputePercent is
// at most this.
const MaxComputePercent = 100

// Share is a part of one GPU that a claim is given, as the scheduler counts
// it on a GPU published shareable (the ComputeCapacity and MemoryCapacity
// it takes, ConsumedShare), the rewrite sizes it, the kubelet plugin's
// checkpoint keeps it, MPS enforces it and the usage records what a run was
// given; a WorkloadProfile's status holds it as a GrantedShare. Every
// package that holds a share holds this one, so that all read the same
// range:
//   - ComputePercent is the share of the GPU's SMs, 0 to MaxComputePercent.
//     0 means the share names no compute amount; like MaxComputePercent it
//     is the whole GPU's compute, and neither is a limit.
//   - MemoryBytes is the share of the GPU's memory, 0 or more. 0 means the
//     share names no memory amount, and is no limit either.
//
// +kubebuilder:object:generate=false
type Share struct {
	ComputePercent int32 `json:"computePercent,omitempty"`
	MemoryBytes    int64 `json:"memoryBytes,omitempty"`
}

// Validate says why s is outside the range, or nil.
func (s Share) Validate() error {
	switch {
	case s.ComputePercent < 0 || s.ComputePercent > MaxComputePercent:
		return fmt.Errorf("compute share %d%% is outside 0 to %d%%", s.ComputePercent, MaxComputePercent)
	case s.MemoryBytes < 0:
		return fmt.Errorf("memory share %d bytes is negative", s.MemoryBytes)
	}
	return nil
}

// MaxComputeLimitFactor bounds a share's compute cap by its compute: a
// share counted for 5 % cannot be granted every SM. The share rule keeps a
// share's request within this factor of its expected peak, too.
const MaxComputeLimitFactor = 2

// GrantedComputeLimit is the compute cap s gets for the cap a GpuConfig
// asks for (sharing.computeLimitPercent): at least s's compute and at most
// MaxComputeLimitFactor times it, within the GPU. It is 0, no cap, where s
// holds no part of the GPU's compute or nothing is asked.
func (s Share) GrantedComputeLimit(asked *int32) int32 {
	if asked == nil || !s.LimitsCompute() {
		return 0
	}
	return min(max(*asked, s.ComputePercent), s.ComputePercent*MaxComputeLimitFactor, MaxComputePercent)
}

// LimitsCompute says whether s holds part of the GPU's SMs: 0 and
// MaxComputePercent are the whole GPU's compute, and so is a figure above
// it, where MPS is given no cap.
func (s Share) LimitsCompute() bool {
	return s.ComputePercent > 0 && s.ComputePercent < MaxComputePercent
}

// LimitsMemory says whether s names an amount of memory; 0 is none, and
// no limit.
func (s Share) LimitsMemory() bool {
	return s.MemoryBytes > 0
}

// Memory is MemoryBytes as a quantity ("8Gi").
func (s Share) Memory() resource.Quantity {
	return *resource.NewQuantity(s.MemoryBytes, resource.BinarySI)
}

// String is "45% compute, 8Gi memory", leaving out an amount that is not
// named: "8Gi memory", "45% compute", or "no amounts".
func (s Share) String() string {
	var parts []string
	if s.ComputePercent != 0 {
		parts = append(parts, fmt.Sprintf("%d%% compute", s.ComputePercent))
	}
	if s.MemoryBytes != 0 {
		m := s.Memory()
		parts = append(parts, m.String()+" memory")
	}
	if len(parts) == 0 {
		return "no amounts"
	}
	return strings.Join(parts, ", ")
}

// ConsumedShare is the share the scheduler counted in an allocation
// result's consumed capacity: its compute, at most MaxComputePercent, and
// its memory; an amount the result does not name is 0.
func ConsumedShare(consumed map[resourceapi.QualifiedName]resource.Quantity) Share {
	var s Share
	if q, ok := consumed[MemoryCapacity.Qualified()]; ok {
		s.MemoryBytes = q.Value()
	}
	if q, ok := consumed[ComputeCapacity.Qualified()]; ok {
		s.ComputePercent = int32(min(q.Value(), MaxComputePercent))
	}
	return s
}

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
		return errors.New("a share cannot be time-sliced: a time slice is set for the whole GPU, which other claims' shares run on")
	}
	return fmt.Errorf("a share of a GPU is enforced by MPS and cannot take sharing.strategy %q", s)
}
