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

// Package claimrewrite is the mutating webhook for ResourceClaims: it
// rewrites the GPU requests of a claim annotated with a WorkloadProfile
// into the prioritized list that pkg/rewrite cuts for the profile, or turns
// profiling on where the profile has no measurements yet.
package claimrewrite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// AutoProfileAnnotation set to "false" on a claim keeps the webhook from
// turning profiling on when the profile has no measurements.
const AutoProfileAnnotation = "prism.dev/auto-profile"

// Event reasons recorded on claims.
const (
	EventReasonRewritten    = "Rewritten"
	EventReasonProfiling    = "ProfilingRequested"
	EventReasonNotRewritten = "NotRewritten"
	// EventReasonShared is a rewrite whose first choice is a share of a
	// GPU sized from the profile's usage.
	EventReasonShared = "Shared"
	// EventReasonLadderNotWritten is a claim whose pod's scheduler counts
	// only exactly requests: it keeps them, with the hard needs.
	EventReasonLadderNotWritten = "LadderNotWritten"
)

// EventRecorder is the part of record.EventRecorder the webhook uses. The
// recorder must not block: client-go's broadcaster queues and drops.
type EventRecorder interface {
	Eventf(object runtime.Object, eventtype, reason, messageFmt string, args ...any)
}

// Options configure New.
type Options struct {
	// Profiles reads WorkloadProfiles. It is called on every annotated
	// claim, so it should be an informer-backed cache.
	Profiles client.Reader
	// Policy is the cluster default; a profile's spec.policy overrides it.
	Policy prismv1alpha1.Policy
	// AutoProfile adds a profiling GpuConfig to claims whose profile has
	// no measurements yet.
	AutoProfile bool
	// Recorder receives one event per annotated claim. Optional.
	Recorder EventRecorder
	// Metrics must not be nil.
	Metrics *Metrics
	// Fleet returns the published GPU fleet that ladders are cut from (see
	// internal/controller/fleet). Nil: the built-in ladders, for a fleet nobody watches.
	Fleet func() *rewrite.Fleet
	// Load returns free devices and pending claims for the load-aware
	// policy (see internal/controller/fleet). Nil: load-aware behaves as performance.
	Load func() *rewrite.Load
	// LoadSynced are the informers Load is read from (every claim and
	// every unscheduled pod): a load-aware claim waits for them, and is
	// admitted unchanged where they have not synced by its deadline, as
	// failurePolicy Ignore admits it while the controller is not ready.
	// Empty: Load is whole from the start.
	LoadSynced []*webhook.Synced
	// Preference is the controller's --preference. Empty: ladders, and
	// the plan names no mode.
	Preference rewrite.PreferenceMode
	// Capacity returns the decision on capacity requests that the
	// controller made from --memory-floor and the API server's answer to
	// MemoryFloorProbe: whether a claim for one whole GPU may get a share
	// sized from its profile's usage first, and whether the memory floor
	// and the tiers' lower bounds may be capacity requests. Nil: neither,
	// and the plan names no decision. pkg/rewrite still decides per claim:
	// the floor stays CEL on fleets with shareable GPUs, the bounds where
	// GPUs publish no figures as capacities (see rewrite.Capacity).
	Capacity func() rewrite.Capacity
	// NoLadderSchedulers are the schedulers that count a claim's GPUs only
	// from its exactly requests (--no-ladder-schedulers): the claims of
	// their pods get no ladder (see rewrite.Cluster.ExactlyOnly).
	NoLadderSchedulers []string
	// PodScheduler returns the scheduler of the pod a claim was made for,
	// "" for a claim without one (PodSchedulers.SchedulerOf). Nil, or no
	// NoLadderSchedulers: no pod is looked up, and every claim may get a
	// ladder.
	PodScheduler func(context.Context, *resourceapi.ResourceClaim) (string, error)
}

// New returns the mutating webhook for ResourceClaim CREATE. It always
// admits: a broken or hostile profile costs the claim its rewrite, never
// its creation.
func New(opts Options) (http.Handler, error) {
	if opts.Profiles == nil || opts.Metrics == nil {
		return nil, errors.New("rewriter needs a profile reader and metrics")
	}
	if _, err := prismv1alpha1.ParsePolicy(string(opts.Policy)); err != nil {
		return nil, err
	}
	r := &rewriter{opts: opts}
	return webhook.ReviewHandler(r.review, r.refuse), nil
}

// warningSkips are the skips the claim's author or the profile's owner can
// fix; the others are either intended or the operator's business.
var warningSkips = map[string]bool{
	skipInvalidProfileName: true,
	skipInvalidProfile:     true,
}

type rewriter struct {
	opts Options
}

// outcome is what review decided, before it is turned into a response.
type outcome struct {
	skip    string // skip reason; "" when ops are set
	message string // for the log and the event
	ops     []webhook.PatchOp
	event   string // event reason, "" for none
}

// refuse admits a claim that the handler would not decode unchanged, as
// one that fails to decode.
func (r *rewriter) refuse(context.Context, *admissionv1.AdmissionRequest, error) *admissionv1.AdmissionResponse {
	r.opts.Metrics.skipped.WithLabelValues(skipDecodeError).Inc()
	return webhook.Allowed()
}

func (r *rewriter) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	logger := klog.FromContext(ctx)
	if req.Operation != admissionv1.Create || req.Resource.Group != resourceapi.GroupName || req.Resource.Resource != "resourceclaims" || req.SubResource != "" {
		r.opts.Metrics.skipped.WithLabelValues(skipUnsupported).Inc()
		return webhook.Allowed()
	}
	claim := &resourceapi.ResourceClaim{}
	if err := json.Unmarshal(req.Object.Raw, claim); err != nil {
		logger.Error(err, "Decoding ResourceClaim, admitting it unchanged")
		r.opts.Metrics.skipped.WithLabelValues(skipDecodeError).Inc()
		return webhook.Allowed()
	}
	if claim.Namespace == "" {
		claim.Namespace = req.Namespace
	}
	if claim.Name == "" {
		claim.Name = req.Name
	}

	// The configurations declare sideEffects: None, so a dry run (kubectl
	// apply --dry-run=server, kubectl diff) must leave no Event behind.
	record := r.event
	if req.DryRun != nil && *req.DryRun {
		record = func(context.Context, *resourceapi.ResourceClaim, string, string, string) {}
	}
	out := r.decide(ctx, claim)
	if out.skip != "" {
		r.opts.Metrics.skipped.WithLabelValues(out.skip).Inc()
		if out.skip != skipNoAnnotation {
			logger.V(2).Info("Admitting claim unchanged", "reason", out.skip, "detail", out.message)
			eventType := corev1.EventTypeNormal
			if warningSkips[out.skip] {
				eventType = corev1.EventTypeWarning
			}
			record(ctx, claim, eventType, EventReasonNotRewritten, out.skip+": "+out.message)
		}
		return webhook.Allowed()
	}
	resp, err := webhook.Patched(out.ops)
	if err != nil {
		logger.Error(err, "Admitting claim unchanged")
		r.opts.Metrics.skipped.WithLabelValues(skipEncodeError).Inc()
		return webhook.Allowed()
	}
	logger.V(2).Info("Patching claim", "action", out.event, "detail", out.message)
	record(ctx, claim, corev1.EventTypeNormal, out.event, out.message)
	return resp
}

// decide works out the patch for an annotated claim, or why there is none.
// It counts rewrites; skips are counted by the caller.
func (r *rewriter) decide(ctx context.Context, claim *resourceapi.ResourceClaim) outcome {
	// The message quotes at most 64 bytes of an invalid value: it goes
	// into an Event and the log, and the value may be 256 KiB.
	name, invalid := prismv1alpha1.ProfileName(claim.Annotations)
	switch {
	case invalid != nil:
		return outcome{skip: skipInvalidProfileName, message: invalid.Error()}
	case name == "":
		return outcome{skip: skipNoAnnotation}
	}
	if err := webhook.WithinAPILimits(&claim.Spec); err != nil {
		return outcome{skip: skipUnsupported, message: err.Error()}
	}
	if !webhook.HasGPURequest(&claim.Spec) {
		return outcome{skip: skipNotGPU, message: "no request for device class " + rewrite.DeviceClassName}
	}

	wp := &prismv1alpha1.WorkloadProfile{}
	err := r.opts.Profiles.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: name}, wp)
	switch {
	case apierrors.IsNotFound(err):
		return r.autoProfile(claim, name, nil)
	case err != nil:
		return outcome{skip: skipLookupError, message: fmt.Sprintf("getting WorkloadProfile %s/%s: %v", claim.Namespace, name, err)}
	}
	return r.rewrite(ctx, claim, wp)
}

func (r *rewriter) rewrite(ctx context.Context, claim *resourceapi.ResourceClaim, wp *prismv1alpha1.WorkloadProfile) outcome {
	profile := webhook.ProfileOf(wp, r.opts.Policy)
	cluster, err := r.cluster(ctx, claim, profile.Policy)
	if err != nil {
		klog.FromContext(ctx).Info("Admitting claim unchanged: its policy weighs the fleet's load, which the controller had not read whole in time", "profile", wp.Name, "err", err)
		return outcome{skip: skipNotSynced, message: fmt.Sprintf("profile %s has policy %s, which weighs every claim and pod: %v; admitted unchanged, as while the controller is not ready", wp.Name, profile.Policy, err)}
	}
	spec, plan, err := rewrite.Rewrite(ctx, &claim.Spec, profile, cluster)
	switch {
	case errors.Is(err, rewrite.ErrInvalidProfile):
		return outcome{skip: skipInvalidProfile, message: err.Error()}
	case err != nil:
		return outcome{skip: skipRewriteError, message: err.Error()}
	}
	// The steps looked at a profile whose bound type nothing measured only
	// where its usage sized what they offer; otherwise the claim is
	// profiled without a verdict.
	if wp.Status.BoundType != "" || plan.SizedFromUsage {
		r.countSteps(plan)
	}
	switch {
	case len(plan.Rewritten) == 0 && wp.Status.BoundType == "":
		// No share or partition sized from its usage was taken: profiled,
		// as a profile that ncu has not measured always was.
		return r.autoProfile(claim, wp.Name, wp)
	case len(plan.Rewritten) == 0 && (plan.BoundType == prismv1alpha1.BoundTypeBalanced || plan.BoundType == prismv1alpha1.BoundTypeUnknown):
		return outcome{skip: skipBalancedUnknown, message: fmt.Sprintf("profile %s is %s: no hardware preference to express", wp.Name, plan.BoundType)}
	case len(plan.Rewritten) == 0 && !preferredByAffinity(plan) && plan.NoLadder == "":
		return outcome{skip: skipNoEligible, message: untouchedSummary(plan)}
	}
	// pkg/rewrite promises catalogue-only selectors; this is the last line
	// before the API server, so the promise is checked, not trusted.
	if bad := foreignSelector(&claim.Spec, spec); bad != "" {
		klog.FromContext(ctx).Error(nil, "Rewrite produced a selector outside the catalogue, admitting claim unchanged", "selector", bad)
		return outcome{skip: skipUnexpectedSelector, message: "generated selector is not in the catalogue"}
	}
	ann, err := plan.Annotation()
	if err != nil {
		return outcome{skip: skipEncodeError, message: err.Error()}
	}
	ops := append(specOps(&claim.Spec, spec), annotationOp(ann))
	if plan.NoLadder != "" {
		return outcome{ops: ops, event: EventReasonLadderNotWritten, message: noLadderSummary(plan)}
	}
	r.opts.Metrics.rewrites.WithLabelValues(string(plan.BoundType), string(plan.Policy)).Inc()
	if f := plan.MemoryFloor.Form; f != "" {
		r.opts.Metrics.memoryFloor.WithLabelValues(string(f)).Inc()
	}
	if f := plan.TierBounds.Form; f != "" {
		r.opts.Metrics.bounds.WithLabelValues(string(f)).Inc()
	}
	if s := shareSummary(plan); s != "" {
		return outcome{ops: ops, event: EventReasonShared, message: fmt.Sprintf("profile %s: %s; %s", plan.Profile, s, planSummary(plan))}
	}
	return outcome{ops: ops, event: EventReasonRewritten, message: planSummary(plan)}
}

// countSteps counts the share and partition steps' verdicts.
func (r *rewriter) countSteps(plan *rewrite.Plan) {
	if plan.Share != nil {
		r.opts.Metrics.shares.WithLabelValues(plan.Share.Verdict).Inc()
	}
	if plan.Partition != nil {
		r.opts.Metrics.partitions.WithLabelValues(plan.Partition.Verdict).Inc()
	}
}

// cluster is what the cluster offers a claim of the given policy: the
// controller's decisions, the fleet and its load as now seen, and whether
// the claim's pod is placed by a scheduler that counts only exactly
// requests. Only the load-aware policy reads the load, and only it waits
// for the claims and pods to be read whole: the load of part of them
// could leave the fastest GPUs to fewer pending claims than wait, or to
// more. The error says that they were not by the review's deadline.
func (r *rewriter) cluster(ctx context.Context, claim *resourceapi.ResourceClaim, policy prismv1alpha1.Policy) (rewrite.Cluster, error) {
	c := rewrite.Cluster{Preference: r.opts.Preference}
	if r.opts.Load != nil && policy == prismv1alpha1.PolicyLoadAware {
		if err := webhook.WaitSynced(ctx, r.opts.LoadSynced...); err != nil {
			return c, err
		}
		c.Load = r.opts.Load()
	}
	c.ExactlyOnly = r.exactlyOnly(ctx, claim)
	if r.opts.Capacity != nil {
		c.Capacity = r.opts.Capacity()
	}
	if r.opts.Fleet != nil {
		// Partitions are offered only where the fleet publishes them.
		c.FleetKnown, c.Fleet, c.Partitions = true, r.opts.Fleet(), true
	}
	return c, nil
}

// exactlyOnly is the scheduler of the claim's pod where it is one of
// NoLadderSchedulers, or "". Where the pod cannot be read the claim gets
// its ladder, as it would without the lookup, and the log says why.
func (r *rewriter) exactlyOnly(ctx context.Context, claim *resourceapi.ResourceClaim) string {
	if len(r.opts.NoLadderSchedulers) == 0 || r.opts.PodScheduler == nil {
		return ""
	}
	name, err := r.opts.PodScheduler(ctx, claim)
	if err != nil {
		klog.FromContext(ctx).Error(err, "Could not tell which scheduler places the claim's pod; the claim may get a ladder")
		return ""
	}
	if slices.Contains(r.opts.NoLadderSchedulers, name) {
		return name
	}
	return ""
}

// autoProfileNote is the annotation written when a claim is profiled
// instead of rewritten.
type autoProfileNote struct {
	Profile string `json:"profile"`
	Action  string `json:"action"`
	Reason  string `json:"reason"`
}

// profilingParameters is the opaque GpuConfig that turns profiling on with
// the driver's defaults. It is written out rather than marshalled from
// GpuConfig so that it carries no defaulted fields: the kubelet plugin's
// defaults apply, whatever version it is.
var profilingParameters = []byte(`{"apiVersion":"` + gpuv1alpha1.GroupName + "/" + gpuv1alpha1.Version +
	`","kind":"` + gpuv1alpha1.GpuConfigKind + `","profiling":{"enabled":true}}`)

func (r *rewriter) autoProfile(claim *resourceapi.ResourceClaim, name string, wp *prismv1alpha1.WorkloadProfile) outcome {
	reason := "profile not found: this run is profiled"
	if wp != nil {
		reason = "profile has no measurements yet: this run is profiled"
	}
	switch {
	case !r.opts.AutoProfile && wp == nil:
		return outcome{skip: skipNotFoundAutoOff, message: fmt.Sprintf("WorkloadProfile %s not found and auto-profiling is off", name)}
	case !r.opts.AutoProfile:
		return outcome{skip: skipNotProfiledAutoOff, message: fmt.Sprintf("WorkloadProfile %s has no measurements and auto-profiling is off", name)}
	case strings.EqualFold(claim.Annotations[AutoProfileAnnotation], "false"):
		return outcome{skip: skipOptOut, message: AutoProfileAnnotation + " is false"}
	case wp != nil && wp.Spec.DisableAutoProfiling:
		return outcome{skip: skipProfileDisablesAuto, message: fmt.Sprintf("WorkloadProfile %s sets disableAutoProfiling", name)}
	}
	refs := unconfiguredGPURequests(&claim.Spec)
	if len(refs) == 0 {
		return outcome{skip: skipGPUConfigPresent, message: "every GPU request already has a GpuConfig; it is not overridden"}
	}
	if len(claim.Spec.Devices.Config) >= resourceapi.DeviceConfigMaxSize {
		return outcome{skip: skipConfigLimit, message: fmt.Sprintf("claim already has %d configs", len(claim.Spec.Devices.Config))}
	}
	config := resourceapi.DeviceClaimConfiguration{
		Requests: refs,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver:     gpuv1alpha1.DriverName,
			Parameters: runtime.RawExtension{Raw: profilingParameters},
		}},
	}
	note, err := json.Marshal(autoProfileNote{Profile: name, Action: "profile", Reason: reason})
	if err != nil {
		return outcome{skip: skipEncodeError, message: err.Error()}
	}
	var op webhook.PatchOp
	if claim.Spec.Devices.Config == nil {
		op = webhook.PatchOp{Op: "add", Path: "/spec/devices/config", Value: []resourceapi.DeviceClaimConfiguration{config}}
	} else {
		op = webhook.PatchOp{Op: "add", Path: "/spec/devices/config/-", Value: config}
	}
	r.opts.Metrics.profiling.Inc()
	return outcome{
		ops:     []webhook.PatchOp{op, annotationOp(string(note))},
		event:   EventReasonProfiling,
		message: fmt.Sprintf("%s; profiling enabled for %s", reason, strings.Join(refs, ", ")),
	}
}

func (r *rewriter) event(ctx context.Context, claim *resourceapi.ResourceClaim, eventType, reason, message string) {
	if r.opts.Recorder == nil {
		return
	}
	if claim.Name != "" {
		r.opts.Recorder.Eventf(claim, eventType, reason, "%s", message)
		return
	}
	// Claims generated from a pod's template get their name only after
	// mutating admission. Their owning pod is known already, and it is
	// where a user looks first: kubectl describe pod.
	for _, ref := range claim.OwnerReferences {
		if ref.Kind == "Pod" && ref.APIVersion == "v1" && ref.Controller != nil && *ref.Controller {
			pod := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: claim.Namespace, Name: ref.Name, UID: ref.UID}
			r.opts.Recorder.Eventf(pod, eventType, reason, "claim for pod %s: %s", ref.Name, message)
			return
		}
	}
	klog.FromContext(ctx).V(4).Info("Claim has neither a name nor an owning pod yet, not recording event", "reason", reason)
}

// annotationOp adds or replaces the rewrite annotation. The annotations map
// exists: the profile annotation brought the claim here.
func annotationOp(value string) webhook.PatchOp {
	return webhook.PatchOp{Op: "add", Path: webhook.AnnotationPath(rewrite.AnnotationKey), Value: value}
}

// specOps replaces only the requests that changed, so that fields of the
// claim this binary does not know (from a newer API server) survive. If
// anything else differs the whole spec is replaced.
func specOps(orig, out *resourceapi.ResourceClaimSpec) []webhook.PatchOp {
	a, b := orig.Devices, out.Devices
	a.Requests, b.Requests = nil, nil
	if len(orig.Devices.Requests) != len(out.Devices.Requests) || !equality.Semantic.DeepEqual(a, b) {
		return []webhook.PatchOp{{Op: "replace", Path: "/spec", Value: out}}
	}
	var ops []webhook.PatchOp
	for i := range out.Devices.Requests {
		if !equality.Semantic.DeepEqual(orig.Devices.Requests[i], out.Devices.Requests[i]) {
			ops = append(ops, webhook.PatchOp{Op: "replace", Path: fmt.Sprintf("/spec/devices/requests/%d", i), Value: out.Devices.Requests[i]})
		}
	}
	return ops
}

// foreignSelector returns a CEL selector of out that neither pkg/rewrite
// generates (catalogue entries, joined) nor the user wrote in orig, or "".
func foreignSelector(orig, out *resourceapi.ResourceClaimSpec) string {
	own := make(map[string]struct{})
	forEachSelector(orig, func(s resourceapi.DeviceSelector) string {
		if s.CEL != nil {
			own[s.CEL.Expression] = struct{}{}
		}
		return ""
	})
	return forEachSelector(out, func(s resourceapi.DeviceSelector) string {
		if s.CEL == nil {
			return "<non-CEL selector>"
		}
		if _, ok := rewrite.Conjuncts(s.CEL.Expression); ok {
			return ""
		}
		if _, ok := own[s.CEL.Expression]; ok {
			return ""
		}
		return s.CEL.Expression
	})
}

// forEachSelector calls f for every request selector and stops at the first
// non-empty result.
func forEachSelector(spec *resourceapi.ResourceClaimSpec, f func(resourceapi.DeviceSelector) string) string {
	for _, r := range spec.Devices.Requests {
		var lists [][]resourceapi.DeviceSelector
		if r.Exactly != nil {
			lists = append(lists, r.Exactly.Selectors)
		}
		for _, sub := range r.FirstAvailable {
			lists = append(lists, sub.Selectors)
		}
		for _, l := range lists {
			for _, s := range l {
				if bad := f(s); bad != "" {
					return bad
				}
			}
		}
	}
	return ""
}

// unconfiguredGPURequests returns the GPU requests (subrequests as
// "request/subrequest") that no gpu.prism.dev config of the claim applies
// to. The kubelet plugin uses the last matching GpuConfig as a whole, so
// adding one for a request the user configured would silently drop the
// user's settings.
func unconfiguredGPURequests(spec *resourceapi.ResourceClaimSpec) []string {
	configured := make(map[string]bool)
	for _, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		if len(c.Requests) == 0 {
			return nil
		}
		for _, name := range c.Requests {
			configured[name] = true
		}
	}
	var refs []string
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName == rewrite.DeviceClassName && !configured[r.Name] {
			refs = append(refs, r.Name)
		}
		if configured[r.Name] {
			continue
		}
		for _, sub := range r.FirstAvailable {
			ref := r.Name + "/" + sub.Name
			if rewrite.IsGPUClass(sub.DeviceClassName) && !configured[ref] {
				refs = append(refs, ref)
			}
		}
	}
	return refs
}

// preferredByAffinity says whether the plan's preference went to the
// pod's node affinity: the claim is then worth its annotation even when no
// request changed (a profile without hard needs).
func preferredByAffinity(p *rewrite.Plan) bool {
	return p.Preference != nil && p.Preference.Mode == rewrite.PreferAffinity && len(p.Preference.Terms) > 0
}

func planSummary(p *rewrite.Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "profile %s (%s, %s): %s", p.Profile, p.BoundType, p.Policy, strings.Join(p.Rewritten, ", "))
	names := make([]string, 0, len(p.Alternatives))
	for _, a := range p.Alternatives {
		names = append(names, a.Name)
	}
	if len(names) > 0 {
		fmt.Fprintf(&b, " -> firstAvailable [%s]", strings.Join(names, ", "))
	}
	if preferredByAffinity(p) {
		fmt.Fprintf(&b, "; the pod gets the %s", p.Preference.TermsSummary())
	}
	if p.HardNeeds != "" {
		fmt.Fprintf(&b, "; hard needs %s", p.HardNeeds)
	}
	if len(p.Untouched) > 0 {
		fmt.Fprintf(&b, "; %d request(s) untouched", len(p.Untouched))
	}
	return b.String()
}

// noLadderSummary says why the claim got no ladder and what it got.
func noLadderSummary(p *rewrite.Plan) string {
	s := fmt.Sprintf("profile %s (%s, %s): ladder not written: %s", p.Profile, p.BoundType, p.Policy, p.NoLadder)
	if len(p.Rewritten) > 0 {
		s += "; exactly requests kept, with the hard needs as a selector: " + strings.Join(p.Rewritten, ", ")
	}
	if len(p.Untouched) > 0 {
		s += fmt.Sprintf("; %d request(s) untouched", len(p.Untouched))
	}
	return s
}

func untouchedSummary(p *rewrite.Plan) string {
	parts := make([]string, 0, len(p.Untouched))
	for _, u := range p.Untouched {
		parts = append(parts, u.Request+": "+u.Reason)
	}
	return "no request could be rewritten (" + strings.Join(parts, "; ") + ")"
}
