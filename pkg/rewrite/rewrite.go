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

// Package rewrite turns the GPU requests of a ResourceClaimSpec into
// prioritized lists (firstAvailable) that follow a workload profile.
//
// Rewrite is a pure function: no clients, no I/O. Every selector it adds is
// taken from a fixed catalogue (see Catalogue) and compiled once under the
// API server's CEL limits; nothing from the profile or the claim is ever
// spliced into CEL. See docs/rewrite.md for the rules and
// docs/design/rewrite-measurements.md for the cost reasoning.
package rewrite

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Rewrite returns a copy of spec in which every eligible GPU request is a
// firstAvailable list ordered for profile, and the plan that explains it.
// opts describe the cluster (a Cluster, or the options that set one field
// of it). The input is never modified. An error means nothing may be
// emitted; the caller should then admit the claim unchanged.
//
// The steps, in order: the tiers sized from the profile's usage (a share,
// MIG partitions), the whole-GPU ladder and the hard needs, the forms the
// needs are written in, each request's list, and the plan's verdicts. For
// a pod whose scheduler counts only exactly requests (Cluster.ExactlyOnly)
// the hard needs are written into the exactly requests instead of lists.
func Rewrite(ctx context.Context, spec *resourceapi.ResourceClaimSpec, profile Profile, opts ...Option) (*resourceapi.ResourceClaimSpec, *Plan, error) {
	if spec == nil {
		return nil, nil, errors.New("rewrite: nil ResourceClaimSpec")
	}
	policy, bound, err := profile.policyAndBound()
	if err != nil {
		return nil, nil, err
	}
	cluster := clusterOf(opts)
	if cluster.ExactlyOnly != "" {
		// A share and a partition are tiers ahead of a ladder.
		cluster.Capacity.Shares, cluster.Partitions = false, false
	}
	w := &claimRewrite{
		cluster: cluster,
		spec:    spec,
		out:     spec.DeepCopy(),
		sharing: sharingOf(spec),
		plan:    &Plan{Profile: truncateName(profile.Name), BoundType: bound, Policy: policy},
	}
	w.plan.Capacity = w.cluster.Capacity.choice()
	w.usageTiers(profile)
	done, err := w.wholeLadder(profile, bound, policy)
	if err != nil || done {
		return w.result(err)
	}
	if w.cluster.ExactlyOnly != "" {
		return w.result(w.exactlyOnly())
	}
	if err := w.forms(); err != nil {
		return w.result(err)
	}
	for i := range w.out.Devices.Requests {
		if err := w.rewriteRequest(&w.out.Devices.Requests[i]); err != nil {
			return w.result(err)
		}
	}
	w.verdicts()
	klog.FromContext(ctx).V(5).Info("Rewrote claim spec", "profile", w.plan.Profile, "boundType", bound, "policy", policy, "rewritten", w.plan.Rewritten, "untouched", len(w.plan.Untouched))
	return w.result(nil)
}

// claimRewrite is one claim's rewrite as its steps build it.
type claimRewrite struct {
	cluster Cluster
	// spec is the claim as written, never changed; out is its copy that
	// the steps rewrite.
	spec, out *resourceapi.ResourceClaimSpec
	sharing   sharingChoices
	plan      *Plan

	// share and parts are the tiers sized from the profile's usage; head
	// is both, the share first, offered ahead of the whole-GPU ladder.
	share *tier
	parts []tier
	head  []tier
	// ladder is the whole-GPU ladder; n the hard needs in every tier.
	ladder []tier
	n      needs
	// full is the ladder of a request that takes the head: the head, then
	// the whole-GPU ladder, which ends in fits, the request as written
	// plus the hard needs. generated are its tiers' selectors.
	full      []tier
	generated [][]string

	// capacityFloor and bounds say whether the memory floor and the tier
	// bounds are written as capacity requests; the forms are what the
	// plan says of them.
	capacityFloor bool
	floorForm     FormChoice
	bounds        bool
	boundsForm    FormChoice

	// shareOptedOut and partitionOptedOut count the requests that keep
	// whole GPUs by their own GpuConfig.
	shareOptedOut, partitionOptedOut int
}

// result is what Rewrite returns: the rewritten claim and its plan, or
// the error and nothing.
func (w *claimRewrite) result(err error) (*resourceapi.ResourceClaimSpec, *Plan, error) {
	if err != nil {
		return nil, nil, fmt.Errorf("rewrite for profile %q: %w", w.plan.Profile, err)
	}
	return w.out, w.plan, nil
}

// usageTiers sizes the profile's usage, once for the claim, and offers the
// share and the MIG partitions it gives where the cluster offers them.
func (w *claimRewrite) usageTiers(p Profile) {
	size := SizeShare(p.Usage)
	w.share, w.plan.Share = w.cluster.shareStep(p, size)
	w.parts, w.plan.Partition = w.cluster.partitionStep(p, size)
	// A partition can be sized where the share is heavy: from SM activity.
	partitionSized := w.plan.Partition != nil && w.plan.Partition.ComputePercent > 0
	w.plan.SizedFromUsage = !p.Exclusive && (size.Verdict == ShareSized && (w.plan.Share != nil || w.plan.Partition != nil) || partitionSized)
	if w.share != nil {
		w.head = append(w.head, *w.share)
	}
	w.head = append(w.head, w.parts...)
}

// wholeLadder decides the whole-GPU ladder and the hard needs. done says
// that every request stays as written, and the plan says why.
func (w *claimRewrite) wholeLadder(p Profile, bound prismv1alpha1.BoundType, policy prismv1alpha1.Policy) (done bool, err error) {
	w.n = needs{memory: -1, cc: -1}
	if bound == prismv1alpha1.BoundTypeBalanced || bound == prismv1alpha1.BoundTypeUnknown {
		// A profile without a bound type has no hard needs either: they
		// come from the same measurement. Its share or partition, where it
		// has one, is offered ahead of the request as written.
		if len(w.head) > 0 {
			return false, nil
		}
		w.untouchAll(fmt.Sprintf("bound type %s: no hardware preference to express", bound))
		return true, nil
	}
	if w.n, err = p.needs(); err != nil {
		return false, err
	}
	w.plan.HardNeeds = w.n.text
	var decision Decision
	w.ladder, w.plan.Fleet, w.plan.Load, decision = w.cluster.decide(bound, policy, w.spec, w.n, busyByModel(p.Usage))
	if w.cluster.Preference != "" {
		w.plan.Preference = &decision
	}
	if len(w.ladder) > 0 || len(w.head) > 0 {
		return false, nil
	}
	reason := fmt.Sprintf("the fleet offers no choice that matters to a %s workload (%s)", bound, w.plan.Fleet)
	if decision.Mode == PreferAffinity {
		reason = "no hard needs; the preference is the pod's node affinity"
	}
	w.untouchAll(reason)
	return true, nil
}

// untouchAll leaves every request as written, for reason.
func (w *claimRewrite) untouchAll(reason string) {
	for _, r := range w.spec.Devices.Requests {
		w.plan.Untouched = append(w.plan.Untouched, Untouched{Request: r.Name, Reason: reason})
	}
}

// forms builds the full ladder and its selectors, and decides for the
// claim whether the memory floor and the tier bounds are capacity
// requests.
func (w *claimRewrite) forms() error {
	w.full = w.ladder
	if len(w.head) > 0 {
		whole := w.ladder
		if len(whole) == 0 {
			whole = []tier{fits}
		}
		w.full = append(w.head, whole...)
	}
	var err error
	if w.generated, err = tierSelectors(w.full, w.n); err != nil {
		return err
	}
	if w.n.floor != nil && w.n.share == nil {
		w.capacityFloor, w.floorForm = w.cluster.memoryFloorForm()
	}
	w.bounds, w.boundsForm = w.cluster.tierBoundsForm()
	// Only the fleet view says whether the GPUs publish smVersion, so the
	// cc floor alone asks for the capacity form only where a fleet is known
	// (a ladder with a bound tier is always cut from one).
	ccBound := w.n.cc >= 0 && w.cluster.Fleet != nil
	if w.bounds && !ccBound && !slices.ContainsFunc(w.full, func(t tier) bool { return t.bound != nil }) {
		w.bounds, w.boundsForm = false, celBecause("no tier of this ladder is a lower bound on a figure, and there is no compute-capability floor")
	}
	return nil
}

// rewriteRequest makes req a firstAvailable list, or records in the plan
// why it stays as written.
func (w *claimRewrite) rewriteRequest(req *resourceapi.DeviceRequest) error {
	if reason := ineligible(req, w.generated); reason != "" {
		w.plan.Untouched = append(w.plan.Untouched, Untouched{Request: req.Name, Reason: reason})
		return nil
	}
	takesShare, takesPartition, whole := w.takesHead(req)
	if !takesShare && !takesPartition && len(w.head) > 0 && len(w.ladder) == 0 {
		w.plan.Untouched = append(w.plan.Untouched, Untouched{Request: req.Name, Reason: "keeps a whole GPU (" + strings.Join(slices.Compact(whole), "; ") + "), and the profile prefers none"})
		return nil
	}
	if takesShare {
		w.plan.Share.Requests = append(w.plan.Share.Requests, req.Name)
	}
	if takesPartition {
		w.plan.Partition.Requests = append(w.plan.Partition.Requests, req.Name)
	}
	ladder, generated := w.requestLadder(takesShare, takesPartition)
	// A request that may not be a share gets no amount of memory: not
	// its memory share, and its floor in CEL.
	reqNeeds, reqFloor := w.n, w.capacityFloor
	if w.sharing.noShare[req.Name] {
		reqNeeds.share, reqFloor = nil, false
	}
	// A memory amount the user wrote stays the request; the floor stays
	// in CEL beside it (see subrequests).
	if reqFloor && w.plan.MemoryFloor.IsZero() && !namesMemory(req.Exactly) {
		w.plan.MemoryFloor = w.floorForm
	}
	requestBounds := w.requestBounds(req, takesPartition)
	subs, err := subrequests(req.Exactly, ladder, generated, reqNeeds, reqFloor, requestBounds)
	if err != nil {
		return err
	}
	req.FirstAvailable = subs
	req.Exactly = nil
	if requestBounds {
		w.out.Devices.Constraints = append(w.out.Devices.Constraints, guard(req.Name))
		w.plan.TierBounds = capacityForm()
	}
	w.plan.Rewritten = append(w.plan.Rewritten, req.Name)
	return nil
}

// takesHead says whether req takes the share and a partition the profile
// got. Where it does not, the plan says why, and whole lists the reasons.
func (w *claimRewrite) takesHead(req *resourceapi.DeviceRequest) (share, partition bool, whole []string) {
	share, partition = w.share != nil, len(w.parts) > 0
	if share {
		if why, byUser := w.sharing.shareIneligible(req.Exactly, req.Name); why != "" {
			w.plan.Share.Whole = append(w.plan.Share.Whole, Untouched{Request: req.Name, Reason: why})
			if byUser {
				w.shareOptedOut++
			}
			share, whole = false, append(whole, why)
		}
	}
	if partition {
		if why, byUser := w.sharing.partitionIneligible(w.spec, req.Exactly, req.Name); why != "" {
			w.plan.Partition.Whole = append(w.plan.Partition.Whole, Untouched{Request: req.Name, Reason: why})
			if byUser {
				w.partitionOptedOut++
			}
			partition, whole = false, append(whole, why)
		}
	}
	return share, partition, whole
}

// requestLadder is the full ladder less the head tiers a request does not
// take, with their selectors.
func (w *claimRewrite) requestLadder(share, partition bool) ([]tier, [][]string) {
	if len(w.head) == 0 {
		return w.full, w.generated
	}
	var ladder []tier
	var generated [][]string
	for i, t := range w.full {
		if t.share != nil && !share || t.partition != "" && !partition {
			continue
		}
		ladder, generated = append(ladder, t), append(generated, w.generated[i])
	}
	return ladder, generated
}

// requestBounds says whether req carries the tier bounds as capacity
// requests; where the claim's would but req cannot, the plan says why.
func (w *claimRewrite) requestBounds(req *resourceapi.DeviceRequest, takesPartition bool) bool {
	why := boundsFit(req.Exactly, len(w.out.Devices.Constraints))
	if why == "" && takesPartition {
		why = "may get a MIG partition, which has no uuid for the guard"
	}
	if !w.bounds || why == "" {
		return w.bounds
	}
	if w.boundsForm.Form == FormCapacity {
		w.boundsForm = celBecause("request %s %s", req.Name, why)
	}
	return false
}

// verdicts closes the plan once every request is written: the steps whose
// share or partition no request took, the alternatives that some request
// got, and the forms the needs took.
func (w *claimRewrite) verdicts() {
	shareTaken := w.share != nil && len(w.plan.Share.Requests) > 0
	if w.share != nil && !shareTaken {
		w.plan.Share.Verdict, w.plan.Share.Reason = noTaker(w.plan.Share.Whole, w.shareOptedOut, ShareNoEligibleRequest, ShareOptedOut, "the share")
		w.plan.Share.ComputePercent, w.plan.Share.Memory = 0, nil
	}
	partitionTaken := len(w.parts) > 0 && len(w.plan.Partition.Requests) > 0
	if len(w.parts) > 0 && !partitionTaken {
		w.plan.Partition.Verdict, w.plan.Partition.Reason = noTaker(w.plan.Partition.Whole, w.partitionOptedOut, PartitionNoEligibleRequest, PartitionOptedOut, "a partition")
		w.plan.Partition.Profiles, w.plan.Partition.ComputePercent, w.plan.Partition.MemoryBytes = nil, 0, 0
	}
	for _, t := range w.full {
		if t.share != nil && !shareTaken || t.partition != "" && !partitionTaken {
			continue
		}
		if t.name == fits.name && len(w.ladder) == 0 && !shareTaken && !partitionTaken {
			continue // no request took the head: the ladder is empty
		}
		w.plan.Alternatives = append(w.plan.Alternatives, Alternative{Name: t.name, Reason: t.reason})
	}
	if w.plan.TierBounds.IsZero() && len(w.plan.Rewritten) > 0 {
		w.plan.TierBounds = w.boundsForm // declined, and why; zero where not asked
	}
	switch {
	case len(w.plan.Rewritten) == 0 || !w.plan.MemoryFloor.IsZero():
	case w.capacityFloor:
		w.plan.MemoryFloor = celBecause("every rewritten request names its own %s amount, or has a GpuConfig whose sharing strategy a share cannot take", gpuv1alpha1.MemoryCapacity.Qualified())
	default:
		w.plan.MemoryFloor = w.floorForm // declined, and why; zero where not asked
	}
}
