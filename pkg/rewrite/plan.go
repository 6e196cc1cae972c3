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
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// AnnotationKey is where the webhook stores Plan.Annotation.
const AnnotationKey = "prism.dev/rewrite"

// MaxAnnotationSize bounds the serialised plan; annotations share a 256 KiB
// budget per object with everything else.
const MaxAnnotationSize = 4096

// Plan explains a rewrite. Alternatives are the same for every rewritten
// request because they only depend on the profile, so they are listed once.
type Plan struct {
	Profile   string                  `json:"profile,omitempty"`
	BoundType prismv1alpha1.BoundType `json:"boundType"`
	Policy    prismv1alpha1.Policy    `json:"policy"`
	// Fleet is the published fleet as the ladder was cut from it: the
	// figure, then its classes best first with the threshold between them.
	Fleet string `json:"fleet,omitempty"`
	// Load is what the load-aware policy decided, and from which figures.
	Load string `json:"load,omitempty"`
	// Preference is how the preference is expressed (ladder or the pod's
	// node affinity) and why; set when the caller chose a mode.
	Preference *Decision `json:"preference,omitempty"`
	// HardNeeds are in every alternative, for example "memory>=39Gi cc>=8.0".
	HardNeeds string `json:"hardNeeds,omitempty"`
	// Capacity is the cluster's decision on capacity requests (see
	// Capacity): the form the controller asks for, from its --memory-floor
	// and the API server's answer to its probe, and why. MemoryFloor and
	// TierBounds say what each claim got of it; Share is there only where
	// shares are offered.
	Capacity FormChoice `json:"capacity,omitzero"`
	// MemoryFloor is how the memory floor was written, where the caller
	// asked for a capacity request (MemoryFloorAsCapacity), and why the
	// capacity request was declined where it was.
	MemoryFloor FormChoice `json:"memoryFloor,omitzero"`
	// TierBounds is how the tiers' lower bounds and the compute-capability
	// floor were written, where the caller asked for capacity requests
	// (TierBoundsAsCapacity), and why they were declined where they were.
	TierBounds FormChoice `json:"tierBounds,omitzero"`
	// Share is what the share step decided, where the caller offered
	// shares (ShareFromUsage): the share and the measured use it was
	// sized from, or why the claim keeps whole GPUs.
	Share *SharePlan `json:"share,omitempty"`
	// Partition is what the partition step decided, where the caller
	// offered MIG partitions (PartitionsFromUsage): the profiles asked for
	// and the measured use they were sized from, or why the claim keeps
	// whole GPUs.
	Partition    *PartitionPlan `json:"partition,omitempty"`
	Alternatives []Alternative  `json:"alternatives,omitempty"`
	// NoLadder is why no request became a firstAvailable list although
	// the profile prefers some GPUs: the scheduler of the claim's pod
	// counts only exactly requests (Cluster.ExactlyOnly).
	NoLadder string `json:"noLadder,omitempty"`
	// Rewritten names the requests that became firstAvailable lists, or,
	// where NoLadder says why there are none, the exactly requests that
	// got the hard needs.
	Rewritten []string    `json:"rewritten,omitempty"`
	Untouched []Untouched `json:"untouched,omitempty"`
	// Truncated is set when Annotation had to drop entries to fit.
	Truncated bool `json:"truncated,omitempty"`
	// SizedFromUsage says that the profile's usage sized a share
	// (SizeShare) or a MIG partition (SizePartition) that the claim was
	// offered, taken or not: the plan rests on measurements even where nothing
	// measured the bound type. It is the admission webhook's, which
	// profiles such a claim only where this is false, and not in the
	// annotation.
	SizedFromUsage bool `json:"-"`
}

// PeakText is how a plan's share names its peak, after its compute:
// " (peaks at 45%)", or "" where the peak is the request.
func PeakText(s *SharePlan) string {
	if s == nil || s.ComputePeakPercent <= s.ComputePercent {
		return ""
	}
	return fmt.Sprintf(" (peaks at %d%%)", s.ComputePeakPercent)
}

// SharePlan is the share step's part of a plan.
type SharePlan struct {
	// Verdict is a ShareVerdict's String: "sized", or why there is no
	// share.
	Verdict string `json:"verdict"`
	// ComputePercent and Memory are the share, for "sized", as the
	// scheduler counts it: ComputePercent is its compute request.
	ComputePercent int64              `json:"computePercent,omitempty"`
	Memory         *resource.Quantity `json:"memory,omitempty"`
	// ComputePeakPercent is the compute the share's runs reach at their
	// p95, with headroom, where that is above its request. The share is
	// not capped at it: between shares the GPU time-slices.
	ComputePeakPercent int64 `json:"computePeakPercent,omitempty"`
	// Usage is the measured use the decision came from (UsageSummary).
	Usage string `json:"usage,omitempty"`
	// Reason is how the figures gave the share, or why there is none.
	Reason string `json:"reason"`
	// Requests are those whose first choice is the share.
	Requests []string `json:"requests,omitempty"`
	// Whole are the requests that keep whole GPUs although the profile
	// got a share, and why.
	Whole []Untouched `json:"whole,omitempty"`
}

// Alternative is one generated subrequest, in preference order.
type Alternative struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Untouched is a request that was left as written.
type Untouched struct {
	Request string `json:"request"`
	Reason  string `json:"reason"`
}

// Annotation returns the plan as compact JSON of at most MaxAnnotationSize
// bytes. Lists are cut from the end, and Truncated set, when a claim has so
// many requests that the full plan would not fit.
func (p *Plan) Annotation() (string, error) {
	// Cutting a list reslices it; only the steps' plans, shared through
	// pointers, need copies.
	c := *p
	if p.Share != nil {
		share := *p.Share
		c.Share = &share
	}
	if p.Partition != nil {
		part := *p.Partition
		c.Partition = &part
	}
	for {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		// ">=" in hard needs would otherwise cost six bytes per character.
		enc.SetEscapeHTML(false)
		if err := enc.Encode(&c); err != nil {
			return "", fmt.Errorf("marshal rewrite plan: %w", err)
		}
		data := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if len(data) <= MaxAnnotationSize {
			return string(data), nil
		}
		c.Truncated = true
		switch {
		case dropLast(&c.Untouched):
		case c.Share != nil && dropLast(&c.Share.Whole):
		case c.Partition != nil && dropLast(&c.Partition.Whole):
		case dropLast(&c.Rewritten):
		case c.Share != nil && dropLast(&c.Share.Requests):
		case c.Partition != nil && dropLast(&c.Partition.Requests):
		default:
			return "", fmt.Errorf("rewrite plan is %d bytes without request lists, limit %d", len(data), MaxAnnotationSize)
		}
	}
}

// dropLast cuts the last element off a non-empty list and tells whether
// it did.
func dropLast[T any](list *[]T) bool {
	if len(*list) == 0 {
		return false
	}
	*list = (*list)[:len(*list)-1]
	return true
}

// truncateName keeps a profile name printable and bounded; it only ever
// reaches JSON, never CEL.
func truncateName(name string) string {
	if len(name) > maxNameInPlan {
		name = name[:maxNameInPlan]
	}
	return strings.ToValidUTF8(name, "\uFFFD")
}
