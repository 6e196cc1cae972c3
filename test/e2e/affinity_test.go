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

package e2e

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/internal/controller/webhook/podaffinity"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestAffinityPlacesAsTheLadder runs the placement cases with
// --preference=affinity: the controller labels the single-model GPU nodes,
// claims carry only their hard needs, and the pod webhook adds preferred
// node affinity. Every job must land on the model it gets with the ladder
// (TestProfileAwarePlacement checks the same table there).
func TestAffinityPlacesAsTheLadder(t *testing.T) {
	e := newControllerEnv(t, string(rewrite.PreferAffinity))

	// The labeller names each node's model.
	for node, model := range map[string]string{"gpu-h100": h100, "gpu-a100": a100, "gpu-l4": l4} {
		waitFor(t, "label "+rewrite.ModelLabel+" on "+node, func() bool {
			n, err := e.cluster.Client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
			return err == nil && n.Labels[rewrite.ModelLabel] == rewrite.ModelLabelValue(model)
		})
	}
	e.placementProfiles(t)
	// The pod webhook reads templates from an informer: wait until it has
	// them, seen through a dry-run pod.
	for _, tmpl := range []string{"stream", "small-stream", "tiny", "gemm"} {
		waitFor(t, "pod webhook sees template "+tmpl, func() bool {
			pod, err := e.cluster.Client.CoreV1().Pods("default").Create(e.ctx, podWithClaim("probe-"+tmpl, tmpl, ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil && len(preferredTerms(pod)) > 0
		})
	}

	excluded := 0
	for _, p := range placements {
		t.Run(p.pod+" lands on "+p.want, func(t *testing.T) {
			if p.hog != "" {
				e.hog(t, p.hog)
			}
			got, claim := e.runPodUntilEnd(t, p.pod, p.template)
			if got != p.want {
				t.Errorf("%s got %s, want %s as with the ladder", p.pod, got, p.want)
			}
			pod, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, p.pod, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			terms := preferredTerms(pod)
			if len(terms) == 0 {
				t.Errorf("pod has no preferred node affinity: %+v", pod.Spec.Affinity)
			}
			for _, r := range claim.Spec.Devices.Requests {
				if len(r.FirstAvailable) > 1 {
					t.Errorf("claim request %s has a ladder %d long, want the hard needs only", r.Name, len(r.FirstAvailable))
				}
			}
			var plan rewrite.Plan
			if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil || plan.Preference == nil || plan.Preference.Mode != rewrite.PreferAffinity {
				t.Errorf("claim's plan %q does not say affinity (%v)", claim.Annotations[rewrite.AnnotationKey], err)
			}
			var note podaffinity.Note
			if err := json.Unmarshal([]byte(pod.Annotations[rewrite.AnnotationKey]), &note); err != nil || note.Claims["gpu"].Mode != rewrite.PreferAffinity {
				t.Errorf("pod annotation %q does not say affinity (%v)", pod.Annotations[rewrite.AnnotationKey], err)
			}
			// The only required term is the exclusion of the models below
			// the claim's memory floor, never the model the pod landed on.
			var wantRequired *corev1.NodeSelector
			if exclude := note.Claims["gpu"].ExcludedNodes(); exclude != nil {
				excluded++
				wantRequired = &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{*exclude}}}}
				if slices.Contains(exclude.Values, rewrite.ModelLabelValue(got)) {
					t.Errorf("%s landed on %s, a model its exclusion %v names", p.pod, got, exclude.Values)
				}
			}
			var required *corev1.NodeSelector
			if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				required = a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			}
			if !reflect.DeepEqual(required, wantRequired) {
				t.Errorf("required node affinity %+v, want %+v", required, wantRequired)
			}
			if p.pod == "stream-1" {
				out := e.explainClaim(t, claim.Name)
				if !strings.Contains(out, "affinity: ") || !strings.Contains(out, rewrite.ModelLabelValue(h100)) {
					t.Errorf("explain does not say the preference went to the pod's affinity:\n%s", out)
				}
			}
		})
	}
	if excluded == 0 {
		t.Error("no placement case kept its pod off the nodes below its memory floor: the exclusion was not exercised")
	}
}

func preferredTerms(pod *corev1.Pod) []corev1.PreferredSchedulingTerm {
	if pod.Spec.Affinity == nil || pod.Spec.Affinity.NodeAffinity == nil {
		return nil
	}
	return pod.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution
}
