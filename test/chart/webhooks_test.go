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

package chart

import (
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
)

func validatingWebhook(t *testing.T, r rendered, name string) *admissionregistrationv1.ValidatingWebhook {
	t.Helper()
	v, ok := r.validating["prism-validate"]
	if !ok {
		t.Fatal("no ValidatingWebhookConfiguration prism-validate rendered")
	}
	i := slices.IndexFunc(v.Webhooks, func(w admissionregistrationv1.ValidatingWebhook) bool { return w.Name == name })
	if i < 0 {
		t.Fatalf("prism-validate has no webhook %s", name)
	}
	return &v.Webhooks[i]
}

// The kubelet plugin's WorkloadProfile writes, status included, go to the
// controller's per-node check, and fail closed.
func TestProfileWritesWebhook(t *testing.T) {
	w := validatingWebhook(t, render(t), "profile-writes.gpu.prism.dev")
	if w.ClientConfig.Service == nil || w.ClientConfig.Service.Path == nil || *w.ClientConfig.Service.Path != "/validate-profile-writes" {
		t.Errorf("client config %+v, want the controller's /validate-profile-writes", w.ClientConfig)
	}
	if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Fail {
		t.Errorf("failurePolicy %v, want Fail", w.FailurePolicy)
	}
	if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Resources, []string{"workloadprofiles", "workloadprofiles/status"}) {
		t.Errorf("rules %+v, want workloadprofiles and their status", w.Rules)
	}
	if len(w.MatchConditions) != 1 || !strings.Contains(w.MatchConditions[0].Expression, `"system:serviceaccount:prism-system:prism-kubelet-plugin"`) {
		t.Errorf("match conditions %+v, want the plugin's ServiceAccount only", w.MatchConditions)
	}
	if w.NamespaceSelector != nil {
		t.Errorf("namespaceSelector %+v: the plugin must be confined in every namespace", w.NamespaceSelector)
	}
}

// Pods and templates with a profile annotation reach the validator, which
// warns when the annotation is where nothing reads it.
func TestProfilePlacementWebhook(t *testing.T) {
	w := validatingWebhook(t, render(t), "profile-placement.gpu.prism.dev")
	var resources []string
	for _, r := range w.Rules {
		resources = append(resources, r.Resources...)
	}
	if !slices.Equal(resources, []string{"pods", "resourceclaimtemplates"}) {
		t.Errorf("resources %v, want pods and resourceclaimtemplates", resources)
	}
	if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
		t.Errorf("failurePolicy %v: warnings must never block a pod", w.FailurePolicy)
	}
	if len(w.MatchConditions) != 1 || !strings.Contains(w.MatchConditions[0].Expression, "'prism.dev/profile' in object.metadata.annotations") {
		t.Errorf("match conditions %+v, want annotated objects only", w.MatchConditions)
	}
}

// rewrite.preference=affinity adds the pod webhook, which may only ever
// be ignored on failure, and the nodes permission the labeller needs; the
// default (ladder) renders neither.
func TestNodePreferenceWebhookAndRBAC(t *testing.T) {
	for _, tc := range []struct {
		preference string
		enabled    bool
	}{{"ladder", false}, {"affinity", true}} {
		t.Run(tc.preference, func(t *testing.T) {
			var args []string
			if tc.preference != "ladder" {
				args = []string{"--set", "rewrite.preference=" + tc.preference}
			}
			r := render(t, args...)
			if arg := "--preference=" + tc.preference; !slices.Contains(container(t, r.controller(t), "controller").Args, arg) {
				t.Errorf("controller args %v lack %s", container(t, r.controller(t), "controller").Args, arg)
			}
			m, ok := r.mutating["prism-rewrite"]
			if !ok {
				t.Fatal("no MutatingWebhookConfiguration prism-rewrite rendered")
			}
			i := slices.IndexFunc(m.Webhooks, func(w admissionregistrationv1.MutatingWebhook) bool { return w.Name == "node-preference.gpu.prism.dev" })
			if (i >= 0) != tc.enabled {
				t.Fatalf("node-preference webhook rendered: %v, want %v", i >= 0, tc.enabled)
			}
			var nodeVerbs []string
			for _, rule := range r.roles["prism-controller"].Rules {
				if slices.Contains(rule.Resources, "nodes") {
					nodeVerbs = append(nodeVerbs, rule.Verbs...)
				}
			}
			if slices.Contains(nodeVerbs, "patch") != tc.enabled {
				t.Errorf("controller's verbs on nodes %v; patch wanted: %v", nodeVerbs, tc.enabled)
			}
			if !tc.enabled {
				return
			}
			w := m.Webhooks[i]
			if w.FailurePolicy == nil || *w.FailurePolicy != admissionregistrationv1.Ignore {
				t.Errorf("failurePolicy %v: a pod must never wait on its preference", w.FailurePolicy)
			}
			if w.ClientConfig.Service == nil || w.ClientConfig.Service.Path == nil || *w.ClientConfig.Service.Path != "/mutate-pods" {
				t.Errorf("client config %+v, want the controller's /mutate-pods", w.ClientConfig)
			}
			if len(w.Rules) != 1 || !slices.Equal(w.Rules[0].Resources, []string{"pods"}) || !slices.Equal(w.Rules[0].Operations, []admissionregistrationv1.OperationType{admissionregistrationv1.Create}) {
				t.Errorf("rules %+v, want pods CREATE", w.Rules)
			}
			if w.NamespaceSelector == nil || !strings.Contains(w.NamespaceSelector.String(), "kube-system") {
				t.Errorf("namespaceSelector %+v, want the other webhooks' (kube-system and the release namespace left out)", w.NamespaceSelector)
			}
			if len(w.MatchConditions) != 1 || !strings.Contains(w.MatchConditions[0].Expression, "object.spec.resourceClaims") {
				t.Errorf("match conditions %+v, want pods with resource claims only", w.MatchConditions)
			}
		})
	}
}
