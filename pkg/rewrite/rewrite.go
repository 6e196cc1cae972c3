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
	"regexp"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// DeviceClassName is the only device class whose requests get rewritten:
// the DeviceClass the chart installs for gpu.prism.dev GPUs, named after the
// driver.
const DeviceClassName = "gpu.prism.dev"

// Profile is what Rewrite needs to know about a workload. Memory figures are
// per device, and out of range beyond prismv1alpha1.MaxDeviceMemory.
type Profile struct {
	Name      string
	BoundType prismv1alpha1.BoundType
	// MinMemory is a hard floor, used as is.
	MinMemory *resource.Quantity
	// PeakMemory is a measured footprint; headroom is added before bucketing.
	PeakMemory *resource.Quantity
	// MinComputeCapability is "major.minor", for example "8.0".
	MinComputeCapability string
	// Policy defaults to performance (prismv1alpha1.PolicyPerformance) when
	// empty.
	Policy prismv1alpha1.Policy
	// ShareMemory asks for the memory need as a share of a GPU rather than a
	// whole one, on GPUs published as shareable (consumable capacity).
	ShareMemory bool
	// Usage is what NVML saw the workload use (status.usage). With
	// ShareFromUsage, a request for one whole GPU gets a share sized from
	// it as its first choice (see SizeShare).
	Usage *prismv1alpha1.UsageProfile
	// Exclusive is the profile's spec.sharing: Exclusive: never a share.
	Exclusive bool
}

// ErrInvalidProfile is wrapped by every error caused by profile contents.
var ErrInvalidProfile = errors.New("invalid profile")

const (
	// headroomFixed covers what a process holds regardless of its model size
	// (CUDA context, cuBLAS/cuDNN workspaces); headroomPercent covers
	// allocator fragmentation and run-to-run variance of the peak. With 10 %
	// alone a 20 GB footprint would land on an L4, which reports 22.5 GiB.
	headroomFixed   = 2 << 30
	headroomPercent = 10
	maxNameInPlan   = 253
)

var ccPattern = regexp.MustCompile(`^([0-9]{1,3})\.([0-9]{1,3})$`)

// needs are the profile's hard requirements after bucketing.
type needs struct {
	memory selectorID // -1: none
	cc     selectorID // -1: none
	// sm is the cc floor as an sm_XY number, for a capacity request on
	// gpuv1alpha1.SMVersionCapacity in its place.
	sm   int64
	text string
	// floor is the memory floor of the memory selector as a quantity, for
	// a capacity request in its place; nil: no memory need.
	floor *resource.Quantity
	// share is the memory to request from a shareable GPU; nil: the whole GPU.
	share *resource.Quantity
}

func (p Profile) needs() (needs, error) {
	n := needs{memory: -1, cc: -1}
	var bytes int64
	for _, f := range []struct {
		name string
		q    *resource.Quantity
	}{{"minMemory", p.MinMemory}, {"peakMemory", p.PeakMemory}} {
		if f.q == nil {
			continue
		}
		// Never Cmp or Value on a tenant's quantity: see BoundedValue. The
		// bound also keeps the headroom arithmetic below inside int64.
		v, err := prismv1alpha1.BoundedValue(field.NewPath(f.name), *f.q, prismv1alpha1.MaxDeviceMemory)
		if err != nil {
			return n, fmt.Errorf("%w: %v", ErrInvalidProfile, err)
		}
		if f.name == "peakMemory" && v > 0 {
			v += (v*headroomPercent+99)/100 + headroomFixed
		}
		bytes = max(bytes, v)
	}
	if bytes > 0 {
		for i, gi := range memoryFloorsGi {
			if bytes <= gi<<30 {
				n.memory = selMemoryFirst + selectorID(i)
				n.floor = resource.NewQuantity(gi<<30, resource.BinarySI)
				n.text = fmt.Sprintf("memory>=%dGi", gi)
				break
			}
		}
		if n.memory < 0 {
			return n, fmt.Errorf("%w: needs %d bytes per device, more than the largest bucket (%dGi)", ErrInvalidProfile, bytes, memoryFloorsGi[len(memoryFloorsGi)-1])
		}
		if p.ShareMemory {
			// Whole GiB, the step the plugin publishes, so that the share is
			// exactly what the scheduler will count.
			gi := (bytes + 1<<30 - 1) >> 30
			n.share = resource.NewQuantity(gi<<30, resource.BinarySI)
			n.text += fmt.Sprintf(" share=%dGi", gi)
		}
	}
	if p.MinComputeCapability != "" {
		m := ccPattern.FindStringSubmatch(p.MinComputeCapability)
		if m == nil {
			return n, fmt.Errorf("%w: minComputeCapability %q is not major.minor", ErrInvalidProfile, p.MinComputeCapability)
		}
		major, _ := strconv.Atoi(m[1])
		minor, _ := strconv.Atoi(m[2])
		for i, f := range ccFloors {
			if major < f.major || major == f.major && minor <= f.minor {
				n.cc = selCCFirst + selectorID(i)
				n.sm = int64(f.major*10 + f.minor)
				if n.text != "" {
					n.text += " "
				}
				n.text += fmt.Sprintf("cc>=%d.%d", f.major, f.minor)
				break
			}
		}
		if n.cc < 0 {
			return n, fmt.Errorf("%w: minComputeCapability %s is above the largest bucket", ErrInvalidProfile, p.MinComputeCapability)
		}
	}
	return n, nil
}

// Rewrite returns a copy of spec in which every eligible GPU request is a
// firstAvailable list ordered for profile, and the plan that explains it.
// The input is never modified. An error means nothing may be emitted; the
// caller should then admit the claim unchanged.
func Rewrite(ctx context.Context, spec *resourceapi.ResourceClaimSpec, profile Profile, opts ...Option) (*resourceapi.ResourceClaimSpec, *Plan, error) {
	if spec == nil {
		return nil, nil, errors.New("rewrite: nil ResourceClaimSpec")
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	policy, bound, err := profile.policyAndBound()
	if err != nil {
		return nil, nil, err
	}
	plan := &Plan{Profile: truncateName(profile.Name), BoundType: bound, Policy: policy}
	out := spec.DeepCopy()

	share, sharePlan := o.shareStep(profile)
	plan.Share = sharePlan
	parts, partitionPlan := o.partitionStep(profile)
	plan.Partition = partitionPlan
	// head are the tiers sized from the profile's usage, ahead of the
	// whole-GPU ladder: the share, then the partitions.
	var head []tier
	if share != nil {
		head = append(head, *share)
	}
	head = append(head, parts...)
	noPreference := bound == prismv1alpha1.BoundTypeBalanced || bound == prismv1alpha1.BoundTypeUnknown
	if noPreference && len(head) == 0 {
		reason := fmt.Sprintf("bound type %s: no hardware preference to express", bound)
		for _, r := range spec.Devices.Requests {
			plan.Untouched = append(plan.Untouched, Untouched{Request: r.Name, Reason: reason})
		}
		return out, plan, nil
	}

	// A profile without a bound type has no hard needs either: they come
	// from the same measurement. Its share or partition, where it has one,
	// is offered ahead of the request as written.
	n := needs{memory: -1, cc: -1}
	var ladder []tier
	if !noPreference {
		n, err = profile.needs()
		if err != nil {
			return nil, nil, fmt.Errorf("rewrite for profile %q: %w", plan.Profile, err)
		}
		plan.HardNeeds = n.text
		var decision Decision
		ladder, plan.Fleet, plan.Load, decision = o.decide(bound, policy, spec, n)
		if o.preference != "" {
			plan.Preference = &decision
		}
		if len(ladder) == 0 && len(head) == 0 {
			reason := fmt.Sprintf("the fleet offers no choice that matters to a %s workload (%s)", bound, plan.Fleet)
			if decision.Mode == PreferAffinity {
				reason = "no hard needs; the preference is the pod's node affinity"
			}
			for _, r := range spec.Devices.Requests {
				plan.Untouched = append(plan.Untouched, Untouched{Request: r.Name, Reason: reason})
			}
			return out, plan, nil
		}
	}
	// full is the ladder of a request that gets the share and the
	// partitions: those, then the whole-GPU ladder, which ends in fits,
	// the request as written plus the hard needs. A request that cannot
	// take the share or a partition gets full without them.
	full := ladder
	if len(head) > 0 {
		whole := ladder
		if len(whole) == 0 {
			whole = []tier{fits}
		}
		full = append(head, whole...)
	}
	generated, err := tierSelectors(full, n)
	if err != nil {
		return nil, nil, fmt.Errorf("rewrite for profile %q: %w", plan.Profile, err)
	}

	capacityFloor, floorForm := false, FormChoice{}
	if n.floor != nil && n.share == nil {
		capacityFloor, floorForm = o.memoryFloorForm()
	}
	bounds, boundsForm := o.tierBoundsForm()
	// Only the fleet view says whether the GPUs publish smVersion, so the
	// cc floor alone asks for the capacity form only where a fleet is known
	// (a ladder with a bound tier is always cut from one).
	ccBound := n.cc >= 0 && o.fleet != nil
	if bounds && !ccBound && !slices.ContainsFunc(full, func(t tier) bool { return t.bound != nil }) {
		bounds, boundsForm = false, celBecause("no tier of this ladder is a lower bound on a figure, and there is no compute-capability floor")
	}
	logger := klog.FromContext(ctx)
	optedOut := 0          // requests that keep whole GPUs by their GpuConfig
	partitionOptedOut := 0 // the same, for partitions
	for i := range out.Devices.Requests {
		req := &out.Devices.Requests[i]
		if reason := ineligible(req, generated); reason != "" {
			plan.Untouched = append(plan.Untouched, Untouched{Request: req.Name, Reason: reason})
			continue
		}
		takesShare, takesPartition := share != nil, len(parts) > 0
		var whole []string // why the request keeps whole GPUs
		if takesShare {
			if why, byUser := o.shareIneligible(req.Exactly, req.Name); why != "" {
				plan.Share.Whole = append(plan.Share.Whole, Untouched{Request: req.Name, Reason: why})
				if byUser {
					optedOut++
				}
				takesShare, whole = false, append(whole, why)
			}
		}
		if takesPartition {
			if why, byUser := o.partitionIneligible(spec, req.Exactly, req.Name); why != "" {
				plan.Partition.Whole = append(plan.Partition.Whole, Untouched{Request: req.Name, Reason: why})
				if byUser {
					partitionOptedOut++
				}
				takesPartition, whole = false, append(whole, why)
			}
		}
		if !takesShare && !takesPartition && len(head) > 0 && len(ladder) == 0 {
			plan.Untouched = append(plan.Untouched, Untouched{Request: req.Name, Reason: "keeps a whole GPU (" + strings.Join(slices.Compact(whole), "; ") + "), and the profile prefers none"})
			continue
		}
		if takesShare {
			plan.Share.Requests = append(plan.Share.Requests, req.Name)
		}
		if takesPartition {
			plan.Partition.Requests = append(plan.Partition.Requests, req.Name)
		}
		reqLadder, reqGenerated := full, generated
		if len(head) > 0 {
			reqLadder, reqGenerated = nil, nil
			for i, t := range full {
				if t.share != nil && !takesShare || t.partition != "" && !takesPartition {
					continue
				}
				reqLadder, reqGenerated = append(reqLadder, t), append(reqGenerated, generated[i])
			}
		}
		// A request that may not be a share gets no amount of memory: not
		// its memory share, and its floor in CEL.
		reqNeeds, reqFloor := n, capacityFloor
		if o.noShare[req.Name] {
			reqNeeds.share, reqFloor = nil, false
		}
		// A memory amount the user wrote stays the request; the floor stays
		// in CEL beside it (see subrequests).
		if reqFloor && plan.MemoryFloor.IsZero() && !namesMemory(req.Exactly) {
			plan.MemoryFloor = floorForm
		}
		requestBounds := bounds
		why := boundsFit(req.Exactly, len(out.Devices.Constraints))
		if why == "" && takesPartition {
			why = "may get a MIG partition, which has no uuid for the guard"
		}
		if bounds && why != "" {
			requestBounds = false
			if boundsForm.Form == FormCapacity {
				boundsForm = celBecause("request %s %s", req.Name, why)
			}
		}
		subs, err := subrequests(req.Exactly, reqLadder, reqGenerated, reqNeeds, reqFloor, requestBounds)
		if err != nil {
			return nil, nil, fmt.Errorf("rewrite for profile %q: %w", plan.Profile, err)
		}
		req.FirstAvailable = subs
		req.Exactly = nil
		if requestBounds {
			out.Devices.Constraints = append(out.Devices.Constraints, guard(req.Name))
			plan.TierBounds = capacityForm()
		}
		plan.Rewritten = append(plan.Rewritten, req.Name)
	}
	shareTaken := share != nil && len(plan.Share.Requests) > 0
	if share != nil && !shareTaken {
		plan.Share.Verdict, plan.Share.Reason = noTaker(plan.Share.Whole, optedOut, ShareNoEligibleRequest, ShareOptedOut, "the share")
		plan.Share.ComputePercent, plan.Share.Memory = 0, nil
	}
	partitionTaken := len(parts) > 0 && len(plan.Partition.Requests) > 0
	if len(parts) > 0 && !partitionTaken {
		plan.Partition.Verdict, plan.Partition.Reason = noTaker(plan.Partition.Whole, partitionOptedOut, PartitionNoEligibleRequest, PartitionOptedOut, "a partition")
		plan.Partition.Profiles, plan.Partition.ComputePercent, plan.Partition.MemoryBytes = nil, 0, 0
	}
	for _, t := range full {
		if t.share != nil && !shareTaken || t.partition != "" && !partitionTaken {
			continue
		}
		if t.name == fits.name && len(ladder) == 0 && !shareTaken && !partitionTaken {
			continue // no request took the head: the ladder is empty
		}
		plan.Alternatives = append(plan.Alternatives, Alternative{Name: t.name, Reason: t.reason})
	}
	if plan.TierBounds.IsZero() && len(plan.Rewritten) > 0 {
		plan.TierBounds = boundsForm // declined, and why; zero where not asked
	}
	switch {
	case len(plan.Rewritten) == 0 || !plan.MemoryFloor.IsZero():
	case capacityFloor:
		plan.MemoryFloor = celBecause("every rewritten request names its own %s amount, or has a GpuConfig whose sharing strategy a share cannot take", gpuv1alpha1.MemoryCapacity.Qualified())
	default:
		plan.MemoryFloor = floorForm // declined, and why; zero where not asked
	}
	logger.V(5).Info("Rewrote claim spec", "profile", plan.Profile, "boundType", bound, "policy", policy, "rewritten", plan.Rewritten, "untouched", len(plan.Untouched))
	return out, plan, nil
}

// tierSelectors builds the generated selectors of each tier: the tier's own
// test first, because on a node of another class it fails on the first
// selector and the rest are never evaluated; then the hard needs.
func tierSelectors(ladder []tier, n needs) ([][]string, error) {
	out := make([][]string, len(ladder))
	for i, t := range ladder {
		for _, id := range append(slices.Clone(t.selectors), n.memory, n.cc) {
			// A partition's memory is its profile's, chosen to hold the
			// workload; the floors are cut for whole cards.
			if id < 0 || t.partition != "" && id == n.memory {
				continue
			}
			s, err := verifiedSelector(id)
			if err != nil {
				return nil, err
			}
			out[i] = append(out[i], s)
		}
	}
	return out, nil
}

// ineligible returns why req must be left alone, or "" if it can be
// rewritten.
func ineligible(req *resourceapi.DeviceRequest, generated [][]string) string {
	switch {
	case len(req.FirstAvailable) > 0:
		return "already a firstAvailable list: the user's order is kept as written"
	case req.Exactly == nil:
		return "no exactly request (unknown request type)"
	case req.Exactly.DeviceClassName != DeviceClassName:
		return "device class is not " + DeviceClassName
	case req.Exactly.AdminAccess != nil && *req.Exactly.AdminAccess:
		return "adminAccess cannot be expressed in a subrequest"
	case req.Exactly.AllocationMode == resourceapi.DeviceAllocationModeAll:
		return "allocationMode All takes every matching device; tiers would change the set, not the choice"
	}
	joinsAny := slices.ContainsFunc(generated, func(g []string) bool { return len(g) > 0 })
	if joinsAny && len(req.Exactly.Selectors) >= resourceapi.DeviceSelectorsMaxSize {
		return fmt.Sprintf("the user's selectors take all %d places; the generated one needs one", resourceapi.DeviceSelectorsMaxSize)
	}
	return ""
}

// subrequests writes one subrequest per tier. With capacityFloor, the
// memory floor becomes a capacity request on gpu.prism.dev/memory instead of
// a CEL selector: the allocator checks it without building a CEL activation.
// That is a floor only on GPUs that are not shareable; on a shareable one it
// would consume the floor instead of the whole GPU and let other claims in,
// so the caller asks for it only where no GPU is published shareable, and
// never for a memory share (the share is the capacity request already).
//
// With bounds, a tier whose test is a lower bound on a figure carries it as
// a capacity request on that figure instead, and so does the compute
// capability floor (see TierBoundsAsCapacity); a subrequest left without
// any selector is guarded by the caller's uuid constraint instead of a
// class selector.
//
// What is left of the generated tests is one selector (see joined), ahead
// of the user's.
func subrequests(exact *resourceapi.ExactDeviceRequest, ladder []tier, generated [][]string, n needs, capacityFloor, bounds bool) ([]resourceapi.DeviceSubRequest, error) {
	subs := make([]resourceapi.DeviceSubRequest, len(ladder))
	for i, t := range ladder {
		e := exact.DeepCopy()
		exprs := generated[i]
		switch {
		case t.partition != "":
			// No capacity requests: the partition is the amount, and a
			// partition publishes no figures as capacities.
		case t.share != nil:
			// The hard needs stay CEL here: the memory floor says how large
			// a GPU the workload needs, the share how much of it the claim
			// takes, and a shareable GPU publishes no smVersion capacity.
			requestCapacity(e, gpuv1alpha1.ComputeCapacity.Qualified(), *resource.NewQuantity(t.share.ComputePercent, resource.DecimalSI))
			requestShare(e, t.share.Memory())
		case n.share != nil:
			requestShare(e, *n.share)
		case capacityFloor && n.floor != nil && requestShare(e, *n.floor):
			exprs = without(exprs, catalogue[n.memory])
		}
		if bounds && t.bound != nil && requestCapacity(e, t.bound.fig.capacity(), *resource.NewQuantity(t.bound.at, resource.DecimalSI)) {
			for _, id := range t.selectors {
				exprs = without(exprs, catalogue[id])
			}
		}
		if bounds && t.share == nil && t.partition == "" && n.cc >= 0 && requestCapacity(e, gpuv1alpha1.SMVersionCapacity.Qualified(), *resource.NewQuantity(n.sm, resource.DecimalSI)) {
			exprs = without(exprs, catalogue[n.cc])
		}
		var sels []resourceapi.DeviceSelector
		if len(exprs) > 0 {
			expr, err := joined(exprs)
			if err != nil {
				return nil, fmt.Errorf("tier %s: %w", t.name, err)
			}
			sels = append(sels, selector(expr))
		}
		sels = append(sels, e.Selectors...)
		subs[i] = resourceapi.DeviceSubRequest{
			Name:            t.name,
			DeviceClassName: subrequestClass(e, t, len(exprs) > 0, bounds),
			Selectors:       sels,
			AllocationMode:  e.AllocationMode,
			Count:           e.Count,
			Tolerations:     e.Tolerations,
			Capacity:        e.Capacity,
		}
	}
	return subs, nil
}

// subrequestClass picks TierDeviceClassName only where a generated selector
// comes first: every catalogue entry requires a gpu.prism.dev attribute or
// capacity, so foreign devices are out before any user selector runs (user
// CEL written for the gpu.prism.dev class may read Prism attributes without
// a guard, and on another driver's device that is an error that aborts
// scheduling of the pod). A capacity request is no such guard: an API server
// without DRAConsumableCapacity drops it and the stable allocator ignores
// it, and the subrequest would then match every driver's devices. Where the
// request is guarded by the uuid constraint (TierBoundsAsCapacity), a
// subrequest with no selector at all needs no class selector either.
//
// A partition's tier uses MIGDeviceClassName, whose own selector keeps it
// to Prism's partitions.
func subrequestClass(e *resourceapi.ExactDeviceRequest, t tier, generatedFirst, guarded bool) string {
	if t.partition != "" {
		return MIGDeviceClassName
	}
	if generatedFirst || guarded && len(e.Selectors) == 0 {
		return TierDeviceClassName
	}
	return e.DeviceClassName
}

// namesMemory says whether the user asked for an amount of memory.
func namesMemory(e *resourceapi.ExactDeviceRequest) bool {
	if e.Capacity == nil {
		return false
	}
	_, userSet := e.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]
	return userSet
}

// requestShare asks for amount of memory unless the user named an amount,
// and says whether it did.
func requestShare(e *resourceapi.ExactDeviceRequest, amount resource.Quantity) bool {
	return requestCapacity(e, gpuv1alpha1.MemoryCapacity.Qualified(), amount)
}

// requestCapacity asks for amount of capacity unless the user named an
// amount of it, and says whether it did.
func requestCapacity(e *resourceapi.ExactDeviceRequest, capacity resourceapi.QualifiedName, amount resource.Quantity) bool {
	if e.Capacity != nil {
		if _, userSet := e.Capacity.Requests[capacity]; userSet {
			return false
		}
	}
	if e.Capacity == nil {
		e.Capacity = &resourceapi.CapacityRequirements{}
	}
	if e.Capacity.Requests == nil {
		e.Capacity.Requests = map[resourceapi.QualifiedName]resource.Quantity{}
	}
	e.Capacity.Requests[capacity] = amount
	return true
}

func without(exprs []string, drop string) []string {
	out := make([]string, 0, len(exprs))
	for _, e := range exprs {
		if e != drop {
			out = append(out, e)
		}
	}
	return out
}

// selector gives each subrequest its own object, so that a caller editing
// one selector of the result cannot change another.
func selector(expr string) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}
}
