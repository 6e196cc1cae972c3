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
