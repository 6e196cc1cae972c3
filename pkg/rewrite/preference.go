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
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// PreferenceMode is how a claim's preference for some GPU models is
// expressed to the scheduler (see docs/rewrite.md, "The preference as node
// affinity").
type PreferenceMode string

const (
	// PreferLadder writes the preference into the claim as firstAvailable
	// tiers: the allocator scans every tier that fails on a node.
	PreferLadder PreferenceMode = "ladder"
	// PreferAffinity leaves only the hard needs in the claim and prefers
	// the nodes of the preferred models through the pod's node affinity,
	// where the fleet allows it.
	PreferAffinity PreferenceMode = "affinity"
)

// ParsePreference checks a preference mode name.
func ParsePreference(s string) (PreferenceMode, error) {
	return parseEither("preference", s, PreferLadder, PreferAffinity)
}

// parseEither reads s as a or b, the two values of a named string type;
// what names the type in the error.
func parseEither[T ~string](what, s string, a, b T) (T, error) {
	if v := T(s); v == a || v == b {
		return v, nil
	}
	return "", fmt.Errorf("unknown %s %q: must be %q or %q", what, s, a, b)
}

// WithPreference asks for the preference to be expressed in mode. With
// PreferAffinity, Rewrite writes only the hard needs when NodePreference
// decides for affinity, and the ladder otherwise.
func WithPreference(mode PreferenceMode) Option {
	return optionFunc(func(c *Cluster) { c.Preference = mode })
}

// Node labels prism-controller publishes on nodes whose GPUs are all one
// model (internal/controller/nodelabels). The pod webhook's terms select on ModelLabel.
const (
	ModelLabel          = gpuv1alpha1.DriverName + "/model"
	BandwidthClassLabel = gpuv1alpha1.DriverName + "/bandwidth-class"
	FP32ClassLabel      = gpuv1alpha1.DriverName + "/fp32-class"
)

// NodeLabelKeys are every label key the node labeller owns.
var NodeLabelKeys = []string{ModelLabel, BandwidthClassLabel, FP32ClassLabel}

// Decision is how a claim's preference is expressed, and why. The claim
// webhook (through Rewrite) and the pod webhook reach it from the same
// inputs by the same function, NodePreference.
type Decision struct {
	Mode   PreferenceMode `json:"mode"`
	Reason string         `json:"reason"`
	// Terms are the pod's preferred node-affinity terms, best tier first;
	// only with Mode PreferAffinity.
	Terms []NodeTerm `json:"terms,omitempty"`
	// Exclude are the published models below the claim's memory floor;
	// only with Mode PreferAffinity. The claim cannot allocate on a node
	// whose GPUs are all of these, so a required term may keep the pod off
	// such nodes before the scheduler runs the allocator there.
	Exclude []string `json:"exclude,omitempty"`
}

// NodeTerm is one preferred node-affinity term: nodes labelled ModelLabel
// with one of the models' label values.
type NodeTerm struct {
	Weight int32    `json:"weight"`
	Tier   string   `json:"tier"`
	Models []string `json:"models"`
}

// LabelValues are the ModelLabel values of the term's models.
func (t NodeTerm) LabelValues() []string {
	out := make([]string, 0, len(t.Models))
	for _, m := range t.Models {
		out = append(out, ModelLabelValue(m))
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// PreferredTerms are the decision's terms as the pod's preferred
// node-affinity terms; none unless the mode is PreferAffinity.
func (d Decision) PreferredTerms() []corev1.PreferredSchedulingTerm {
	if d.Mode != PreferAffinity {
		return nil
	}
	out := make([]corev1.PreferredSchedulingTerm, 0, len(d.Terms))
	for _, t := range d.Terms {
		out = append(out, corev1.PreferredSchedulingTerm{Weight: t.Weight, Preference: corev1.NodeSelectorTerm{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: ModelLabel, Operator: corev1.NodeSelectorOpIn, Values: t.LabelValues()}},
		}})
	}
	return out
}

// ExcludedNodes is the required node-selector requirement that keeps a pod
// off the single-model nodes of the excluded models; nil when none is.
func (d Decision) ExcludedNodes() *corev1.NodeSelectorRequirement {
	if d.Mode != PreferAffinity {
		return nil
	}
	return ExcludeModels(d.Exclude...)
}

// ExcludeModels is ModelLabel NotIn the models' label values; nil for no
// model. Nodes without the label (mixed nodes, nodes not labelled yet)
// pass it.
func ExcludeModels(models ...string) *corev1.NodeSelectorRequirement {
	if len(models) == 0 {
		return nil
	}
	return &corev1.NodeSelectorRequirement{Key: ModelLabel, Operator: corev1.NodeSelectorOpNotIn, Values: NodeTerm{Models: models}.LabelValues()}
}

// TermsSummary is the terms for an event, a log line or a note.
func (d Decision) TermsSummary() string {
	parts := make([]string, 0, len(d.Terms))
	for _, t := range d.Terms {
		parts = append(parts, fmt.Sprintf("%s weight %d", strings.Join(t.LabelValues(), "|"), t.Weight))
	}
	summary := "preferred node affinity on " + ModelLabel + " [" + strings.Join(parts, ", ") + "]"
	if len(d.Exclude) > 0 {
		summary += "; nodes of " + strings.Join(NodeTerm{Models: d.Exclude}.LabelValues(), "|") + " cannot hold it"
	}
	return summary
}

// topTermWeight is the best tier's weight; each further tier gets half.
// NodeAffinity normalises its score over the feasible nodes, so the
// weights only order the tiers.
const topTermWeight = 100

// NodePreference decides how profile's preference is expressed on the
// cluster that opts describe (a Cluster, or WithFleet and WithPreference).
// It is pure, and Rewrite reaches the same decision from the same inputs.
func NodePreference(profile Profile, opts ...Option) (*Decision, error) {
	c := clusterOf(opts)
	policy, bound, err := profile.policyAndBound()
	if err != nil {
		return nil, err
	}
	if bound == prismv1alpha1.BoundTypeBalanced || bound == prismv1alpha1.BoundTypeUnknown {
		return &Decision{Mode: PreferLadder, Reason: fmt.Sprintf("bound type %s: no hardware preference to express", bound)}, nil
	}
	n, err := profile.needs()
	if err != nil {
		return nil, fmt.Errorf("node preference for profile %q: %w", truncateName(profile.Name), err)
	}
	_, _, _, d := c.decide(bound, policy, &resourceapi.ResourceClaimSpec{}, n, busyByModel(profile.Usage))
	return &d, nil
}

// policyAndBound applies the defaults and rejects unknown values.
func (p Profile) policyAndBound() (prismv1alpha1.Policy, prismv1alpha1.BoundType, error) {
	policy := p.Policy
	if policy == "" {
		policy = prismv1alpha1.PolicyPerformance
	}
	if policy != prismv1alpha1.PolicyPerformance && policy != prismv1alpha1.PolicyEconomy && policy != prismv1alpha1.PolicyLoadAware {
		return "", "", fmt.Errorf("%w: unknown policy %q", ErrInvalidProfile, p.Policy)
	}
	bound := p.BoundType
	if bound == "" {
		bound = prismv1alpha1.BoundTypeUnknown
	}
	switch bound {
	case prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.BoundTypeBalanced, prismv1alpha1.BoundTypeUnknown:
	default:
		return "", "", fmt.Errorf("%w: unknown bound type %q", ErrInvalidProfile, p.BoundType)
	}
	return policy, bound, nil
}

// decide is the ladder for the claim and how its preference is expressed.
// In affinity mode the claim keeps only the fits tier (none without hard
// needs), and the decision names the models of each preferred tier.
func (c Cluster) decide(bound prismv1alpha1.BoundType, policy prismv1alpha1.Policy, spec *resourceapi.ResourceClaimSpec, n needs, busy map[string]int64) ([]tier, string, string, Decision) {
	ladder, cut, load := c.ladder(bound, policy, spec, n, busy)
	d := Decision{Mode: PreferLadder}
	prefer := preferred(ladder)
	switch {
	case c.Preference != PreferAffinity:
		d.Reason = "the controller expresses preferences as ladders (--preference=ladder)"
		return ladder, cut, load, d
	case !c.FleetKnown:
		d.Reason = "no published fleet known: the built-in ladders name no models"
		return ladder, cut, load, d
	case policy == prismv1alpha1.PolicyLoadAware:
		d.Reason = "load-aware decides from the live load, which may change between the pod's admission and its claim's"
		return ladder, cut, load, d
	case len(prefer) == 0:
		d.Reason = "no preferred tier: nothing to prefer"
		return ladder, cut, load, d
	}
	for _, m := range fitting(c.Fleet, n).Models {
		if m.MixedDevices > 0 {
			d.Reason = fmt.Sprintf("%d of %d %s devices sit on nodes with other models, where a preferred node does not choose the device", m.MixedDevices, m.Devices, m.Name)
			return ladder, cut, load, d
		}
	}
	d.Mode = PreferAffinity
	d.Reason = "every model that holds the workload is on single-model nodes, labelled " + ModelLabel
	seen := map[string]bool{}
	weight := int32(topTermWeight)
	for _, t := range prefer {
		var added []string
		for _, m := range t.models {
			if !seen[m] {
				seen[m] = true
				added = append(added, m)
			}
		}
		if len(added) == 0 {
			continue
		}
		d.Terms = append(d.Terms, NodeTerm{Weight: weight, Tier: t.name, Models: added})
		weight /= 2
	}
	if n.text == "" {
		return nil, cut, load, d
	}
	d.Exclude = belowFloor(c.Fleet, n)
	return []tier{fits}, cut, load, d
}

// belowFloor are the fleet's models whose largest GPU is below the memory
// floor of n, less any whose label value a model above the floor shares
// (ModelLabelValue is lossy): a NotIn on that value would exclude nodes
// the claim fits.
func belowFloor(fleet *Fleet, n needs) []string {
	if fleet == nil || n.floor == nil {
		return nil
	}
	fit := map[string]bool{}
	fitValues := map[string]bool{}
	for _, m := range fitting(fleet, n).Models {
		fit[m.Name] = true
		fitValues[ModelLabelValue(m.Name)] = true
	}
	var out []string
	for _, m := range fleet.Models {
		if !fit[m.Name] && !fitValues[ModelLabelValue(m.Name)] {
			out = append(out, m.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ModelLabelValue is a product name as a label value: every character a
// value may not hold becomes '-', runs of them one, cut to 63 characters
// and trimmed to start and end alphanumeric.
func ModelLabelValue(name string) string {
	var b strings.Builder
	dash := false
	for _, r := range name {
		ok := r < 128 && (r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-')
		if !ok {
			if !dash {
				b.WriteByte('-')
			}
			dash = true
			continue
		}
		b.WriteRune(r)
		dash = r == '-'
	}
	v := b.String()
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.TrimFunc(v, func(r rune) bool { return r == '-' || r == '.' || r == '_' })
}

// NodeLabels are the labels a node whose GPUs are of the given models
// should carry on fleet: none unless they are all one model; then its
// model, and its class in the fleet cut on each figure that has at least
// two classes (1 is the best). The cut is the whole fleet's, as in the
// ladder of a workload without a memory floor.
func NodeLabels(models []string, fleet *Fleet) map[string]string {
	models = slices.Compact(slices.Sorted(slices.Values(models)))
	if len(models) != 1 || models[0] == "" || fleet == nil {
		return nil
	}
	labels := map[string]string{ModelLabel: ModelLabelValue(models[0])}
	for f, key := range map[figure]string{figBandwidth: BandwidthClassLabel, figFP32: FP32ClassLabel} {
		c := cutFleet(fleet.Models, f)
		if len(c.classes) < 2 {
			continue
		}
		for i, cl := range c.classes {
			if slices.ContainsFunc(cl.models, func(m Model) bool { return m.Name == models[0] }) {
				labels[key] = strconv.Itoa(i + 1)
			}
		}
	}
	return labels
}
