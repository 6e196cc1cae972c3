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

// Package podaffinity is the mutating webhook for Pods that, with
// --preference=affinity, gives a pod preferred node affinity for its
// profiled claims: the preference that the claim webhook would otherwise
// put into a prioritized list.
package podaffinity

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Outcomes of the pod webhook, as metric label values.
const (
	podAffinityAdded     = "affinity-added"
	podLadderMode        = "ladder-mode"
	podNoPreference      = "no-preference"
	podNotCached         = "not-cached"
	podLookupError       = "lookup-error"
	podDecodeError       = "decode-error"
	podEncodeError       = "encode-error"
	podUnsupported       = "unsupported-request"
	podNoProfiledClaim   = "no-profiled-claim"
	podProfileUnmeasured = "profile-unmeasured"
	// podNotSynced: the pod names a claim that the claims' store did not
	// hold, and the store had not synced by the review's deadline.
	podNotSynced = "not-synced"
)

// Options configure New. The readers must be informer-backed caches: the
// webhook is on the path of every pod with resource claims.
type Options struct {
	// Templates reads ResourceClaimTemplates, Profiles WorkloadProfiles.
	Templates, Profiles client.Reader
	// Claims is the ResourceClaim informer's store, which holds
	// fleet.Claims (the informer's transform is fleet.TrimClaim).
	Claims toolscache.KeyGetter
	// ClaimsSynced says when Claims holds every claim. A claim it does
	// not hold before may exist: the review waits for it. Nil: Claims is
	// read from the start.
	ClaimsSynced *webhook.Synced
	// Policy is the cluster default, as for the claim webhook.
	Policy prismv1alpha1.Policy
	// Preference is the controller's --preference; with PreferLadder every
	// pod is admitted unchanged.
	Preference rewrite.PreferenceMode
	// Fleet returns the published fleet (internal/controller/fleet).
	Fleet   func() *rewrite.Fleet
	Metrics *Metrics
}

// New returns the mutating webhook for Pod CREATE that adds preferred
// node-affinity terms for the pod's profiled claims, where
// rewrite.NodePreference decides for affinity. It always admits. The only
// required term it adds keeps the pod off the single-model nodes whose GPUs
// are below one of its claims' memory floors (rewrite.Decision.ExcludedNodes):
// the claim cannot allocate there, and the scheduler then rejects those nodes
// without running the allocator on them.
func New(opts Options) (http.Handler, error) {
	if opts.Templates == nil || opts.Claims == nil || opts.Profiles == nil || opts.Fleet == nil || opts.Metrics == nil {
		return nil, errors.New("pod preference webhook needs template, claim and profile readers, a fleet and metrics")
	}
	if _, err := rewrite.ParsePreference(string(opts.Preference)); err != nil {
		return nil, err
	}
	p := &podPreference{opts: opts}
	return webhook.ReviewHandler(p.review, webhook.AdmitUnchanged), nil
}

type podPreference struct {
	opts Options
}

// Note is what the webhook writes under prism.dev/rewrite on a pod it gave
// terms: per claim, the decision.
type Note struct {
	Claims map[string]rewrite.Decision `json:"claims"`
}

func (p *podPreference) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	logger := klog.FromContext(ctx)
	count := func(outcome string) *admissionv1.AdmissionResponse {
		p.opts.Metrics.outcomes.WithLabelValues(outcome).Inc()
		return webhook.Allowed()
	}
	if p.opts.Preference != rewrite.PreferAffinity {
		return count(podLadderMode)
	}
	if req.Operation != admissionv1.Create || req.Resource.Group != "" || req.Resource.Resource != "pods" || req.SubResource != "" {
		return count(podUnsupported)
	}
	pod := &corev1.Pod{}
	if err := json.Unmarshal(req.Object.Raw, pod); err != nil {
		logger.Error(err, "Decoding Pod, admitting it unchanged")
		return count(podDecodeError)
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	note := Note{Claims: map[string]rewrite.Decision{}}
	var terms []corev1.PreferredSchedulingTerm
	var exclude []string
	outcome := podNoProfiledClaim
	for _, c := range pod.Spec.ResourceClaims {
		d, why := p.decision(ctx, pod.Namespace, c)
		if d == nil {
			if why != "" {
				outcome = why
			}
			continue
		}
		note.Claims[c.Name] = *d
		if d.Mode != rewrite.PreferAffinity {
			outcome = podNoPreference
			continue
		}
		terms = append(terms, d.PreferredTerms()...)
		if d.ExcludedNodes() != nil {
			exclude = append(exclude, d.Exclude...)
		}
	}
	if len(terms) == 0 {
		if outcome != podNoProfiledClaim {
			logger.V(4).Info("Admitting pod without node preference", "pod", klog.KObj(pod), "outcome", outcome)
		}
		return count(outcome)
	}
	ann, err := json.Marshal(note)
	if err != nil {
		logger.Error(err, "Encoding the pod's preference note, admitting it unchanged")
		return count(podEncodeError)
	}
	resp, err := webhook.Patched(append(affinityOps(pod, terms, rewrite.ExcludeModels(exclude...)), podAnnotationOp(pod, string(ann))))
	if err != nil {
		logger.Error(err, "Admitting pod unchanged")
		return count(podEncodeError)
	}
	logger.V(2).Info("Adding preferred node affinity", "pod", klog.KObj(pod), "generateName", pod.GenerateName, "terms", len(terms), "excludedModels", exclude, "preference", string(ann))
	p.opts.Metrics.outcomes.WithLabelValues(podAffinityAdded).Inc()
	return resp
}

// decision is the preference of one pod claim: decided now from its
// template's profile, or read from the plan of the claim it names. Nil
// with the outcome when there is none.
func (p *podPreference) decision(ctx context.Context, ns string, c corev1.PodResourceClaim) (*rewrite.Decision, string) {
	switch {
	case c.ResourceClaimTemplateName != nil:
		tmpl := &resourceapi.ResourceClaimTemplate{}
		if outcome := get(ctx, p.opts.Templates, ns, *c.ResourceClaimTemplateName, tmpl, podNotCached); outcome != "" {
			return nil, outcome
		}
		// An invalid name names no profile; the claim webhook says why,
		// with an Event on the pod, when the template makes the claim.
		name, _ := prismv1alpha1.ProfileName(tmpl.Spec.ObjectMeta.Annotations)
		if name == "" || !webhook.HasGPURequest(&tmpl.Spec.Spec) {
			return nil, ""
		}
		wp := &prismv1alpha1.WorkloadProfile{}
		if outcome := get(ctx, p.opts.Profiles, ns, name, wp, podProfileUnmeasured); outcome != "" {
			return nil, outcome
		}
		if wp.Status.BoundType == "" {
			return nil, podProfileUnmeasured
		}
		d, err := rewrite.NodePreference(webhook.ProfileOf(wp, p.opts.Policy), rewrite.WithFleet(p.opts.Fleet()), rewrite.WithPreference(p.opts.Preference))
		if err != nil {
			// The claim webhook skips it too, with an event on the claim.
			return nil, podNoPreference
		}
		return d, ""
	case c.ResourceClaimName != nil:
		claim, outcome := p.claim(ctx, ns, *c.ResourceClaimName)
		if claim == nil {
			return nil, outcome
		}
		var plan rewrite.Plan
		if json.Unmarshal([]byte(claim.Plan()), &plan) != nil || plan.Preference == nil {
			return nil, ""
		}
		return plan.Preference, ""
	}
	return nil, ""
}

// get reads ns/name from a cache into obj. It returns "" when it did, or
// the pod's outcome when it did not: missing where there is no such
// object, podLookupError (logged) where the cache failed.
func get(ctx context.Context, cache client.Reader, ns, name string, obj client.Object, missing string) string {
	err := cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, obj)
	switch {
	case err == nil:
		return ""
	case apierrors.IsNotFound(err):
		return missing
	}
	klog.FromContext(ctx).Error(err, "Reading from the cache", "kind", fmt.Sprintf("%T", obj), "object", klog.KRef(ns, name))
	return podLookupError
}

// claim reads ns/name from the claims' store. Nil with the pod's outcome
// where it cannot: podNotCached where there is no such claim,
// podNotSynced (logged) where the store, which did not hold it, had not
// synced by the review's deadline, podLookupError (logged) where the
// store failed. A claim the store holds before it has synced is the one
// it holds after: its initial list only adds claims.
func (p *podPreference) claim(ctx context.Context, ns, name string) (*fleet.Claim, string) {
	key := toolscache.NewObjectName(ns, name).String()
	synced := p.opts.ClaimsSynced.HasSynced()
	obj, exists, err := p.opts.Claims.GetByKey(key)
	if err == nil && !exists && !synced {
		if err := webhook.WaitSynced(ctx, p.opts.ClaimsSynced); err != nil {
			klog.FromContext(ctx).Info("Admitting pod without node preference for its claim", "claim", klog.KRef(ns, name), "err", err)
			return nil, podNotSynced
		}
		obj, exists, err = p.opts.Claims.GetByKey(key)
	}
	switch claim, ok := obj.(*fleet.Claim); {
	case err != nil:
	case !exists:
		return nil, podNotCached
	case !ok:
		err = fmt.Errorf("the store holds a %T, not a fleet.Claim", obj)
	default:
		return claim, ""
	}
	klog.FromContext(ctx).Error(err, "Reading from the claims' store", "claim", klog.KRef(ns, name))
	return nil, podLookupError
}

// affinityOps appends terms to the pod's preferred node affinity and, when
// exclude is set, ANDs it into each of the pod's required terms (one term
// of its own if the pod has none), creating what is missing. The pod's own
// affinity stays.
func affinityOps(pod *corev1.Pod, terms []corev1.PreferredSchedulingTerm, exclude *corev1.NodeSelectorRequirement) []webhook.PatchOp {
	const nodeAffinity = "/spec/affinity/nodeAffinity"
	var ownRequired *corev1.NodeSelector
	if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
		ownRequired = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	}
	// A pod's own required selector without terms is invalid, and the API
	// server rejects the pod: there is no term to AND the exclusion into.
	var required *corev1.NodeSelector
	if exclude != nil && ownRequired == nil {
		required = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{*exclude}}}}
	}
	a := pod.Spec.Affinity
	switch {
	case a == nil:
		return []webhook.PatchOp{{Op: "add", Path: "/spec/affinity", Value: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: required, PreferredDuringSchedulingIgnoredDuringExecution: terms}}}}
	case a.NodeAffinity == nil:
		return []webhook.PatchOp{{Op: "add", Path: nodeAffinity, Value: &corev1.NodeAffinity{
			RequiredDuringSchedulingIgnoredDuringExecution: required, PreferredDuringSchedulingIgnoredDuringExecution: terms}}}
	}
	var ops []webhook.PatchOp
	if a.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution == nil {
		ops = append(ops, webhook.PatchOp{Op: "add", Path: nodeAffinity + "/preferredDuringSchedulingIgnoredDuringExecution", Value: terms})
	} else {
		for _, t := range terms {
			ops = append(ops, webhook.PatchOp{Op: "add", Path: nodeAffinity + "/preferredDuringSchedulingIgnoredDuringExecution/-", Value: t})
		}
	}
	switch {
	case exclude == nil:
	case required != nil:
		ops = append(ops, webhook.PatchOp{Op: "add", Path: nodeAffinity + "/requiredDuringSchedulingIgnoredDuringExecution", Value: required})
	default:
		for i, t := range ownRequired.NodeSelectorTerms {
			path := fmt.Sprintf("%s/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms/%d/matchExpressions", nodeAffinity, i)
			if t.MatchExpressions == nil {
				ops = append(ops, webhook.PatchOp{Op: "add", Path: path, Value: []corev1.NodeSelectorRequirement{*exclude}})
			} else {
				ops = append(ops, webhook.PatchOp{Op: "add", Path: path + "/-", Value: *exclude})
			}
		}
	}
	return ops
}

func podAnnotationOp(pod *corev1.Pod, value string) webhook.PatchOp {
	if pod.Annotations == nil {
		return webhook.PatchOp{Op: "add", Path: "/metadata/annotations", Value: map[string]string{rewrite.AnnotationKey: value}}
	}
	return webhook.PatchOp{Op: "add", Path: webhook.AnnotationPath(rewrite.AnnotationKey), Value: value}
}
