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

package claimrewrite

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prismgpu/prism/internal/controller/webhook"
)

// Metrics count what the rewrite webhook did with the claims it reviewed.
type Metrics struct {
	skipped   *prometheus.CounterVec
	rewrites  *prometheus.CounterVec
	profiling prometheus.Counter
	// memoryFloor counts rewrites with --memory-floor=capacity by the form
	// their floor took.
	memoryFloor *prometheus.CounterVec
	// bounds counts rewrites with --memory-floor=capacity by the form
	// their tier bounds took.
	bounds *prometheus.CounterVec
	// shares counts rewritten claims whose profile the share step looked
	// at, by its verdict: sized, or why the claim keeps whole GPUs.
	shares *prometheus.CounterVec
	// partitions counts rewritten claims whose profile the partition step
	// looked at, by its verdict: sized, or why no MIG partition comes first.
	partitions *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them with reg. A nil reg
// leaves them unregistered, which is what tests and benchmarks want.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		skipped:  webhook.CounterVec("prism_webhook_rewrite_skipped_total", "ResourceClaims the rewrite webhook admitted unchanged, by reason.", "reason"),
		rewrites: webhook.CounterVec("prism_webhook_rewrites_total", "ResourceClaims whose GPU requests were rewritten into prioritized lists.", "bound_type", "policy"),
		profiling: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "prism_webhook_profiling_requested_total",
			Help: "ResourceClaims that got a profiling GpuConfig because their profile had no measurements.",
		}),
		memoryFloor: webhook.CounterVec("prism_webhook_memory_floor_total", "Rewritten claims with --memory-floor=capacity, by the form their memory floor took: capacity, or cel where the fleet publishes shareable GPUs.", "form"),
		bounds:      webhook.CounterVec("prism_webhook_tier_bounds_total", "Rewritten claims with --memory-floor=capacity, by the form their tier bounds took: capacity, or cel where the fleet, the ladder or the request does not allow capacity requests (the plan's tierBounds says why).", "form"),
		shares:      webhook.CounterVec("prism_webhook_share_total", "Rewritten claims the share step looked at (the API server keeps capacity requests), by verdict: sized (a share of a GPU first), or why not (no-usage, no-peak-memory, heavy, opted-out, no-shareable-gpu, no-eligible-request).", "verdict"),
		partitions:  webhook.CounterVec("prism_webhook_partition_total", "Rewritten claims the MIG partition step looked at (the fleet publishes partitions), by verdict: sized (a partition first), or why not (no-usage, no-peak-memory, heavy, opted-out, none-fits, no-eligible-request).", "verdict"),
	}
	return webhook.Registered(reg, m, m.skipped, m.rewrites, m.profiling, m.memoryFloor, m.bounds, m.shares, m.partitions)
}

// Skip reasons. They are metric label values, so the set is closed.
const (
	skipUnsupported         = "unsupported-request"
	skipDecodeError         = "decode-error"
	skipNoAnnotation        = "no-annotation"
	skipInvalidProfileName  = "invalid-profile-name"
	skipNotGPU              = "not-a-gpu-claim"
	skipLookupError         = "profile-lookup-error"
	skipNotFoundAutoOff     = "profile-not-found-autoprofile-off"
	skipNotProfiledAutoOff  = "profile-not-profiled-autoprofile-off"
	skipOptOut              = "auto-profile-opt-out"
	skipProfileDisablesAuto = "auto-profile-disabled-by-profile"
	skipGPUConfigPresent    = "gpu-config-present"
	skipConfigLimit         = "config-limit"
	skipBalancedUnknown     = "balanced-or-unknown"
	skipNoEligible          = "no-eligible-request"
	skipInvalidProfile      = "invalid-profile"
	skipRewriteError        = "rewrite-error"
	skipUnexpectedSelector  = "unexpected-selector"
	skipEncodeError         = "encode-error"
	// skipNotSynced: the load-aware policy weighs every claim and pod, and
	// their informers had not synced by the review's deadline.
	skipNotSynced = "not-synced"
)
