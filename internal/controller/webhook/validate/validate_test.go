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

package validate

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

func TestValidator(t *testing.T) {
	tests := []struct {
		name    string
		fixture string
		kind    metav1.GroupVersionKind
		op      admissionv1.Operation
		// oldFixture is the object an update replaces; "": none.
		oldFixture string
		// wantDenied lists substrings of the denial message; empty means
		// the object is admitted.
		wantDenied  []string
		wantWarning string
	}{
		{name: "claim without config", fixture: "claim-plain.json", kind: webhooktest.ClaimGVK},
		{name: "claim with valid GpuConfig", fixture: "claim-good-config.json", kind: webhooktest.ClaimGVK},
		{
			name: "claim with invalid GpuConfig", fixture: "claim-bad-config.json", kind: webhooktest.ClaimGVK,
			wantDenied: []string{`ResourceClaim.resource.k8s.io "" is invalid`, "spec.devices.config[1].opaque.parameters", `sharing.strategy: Unsupported value: "Sometimes"`},
		},
		{
			name: "claim update is validated too", fixture: "claim-bad-config.json", kind: webhooktest.ClaimGVK, op: admissionv1.Update,
			wantDenied: []string{"spec.devices.config[1].opaque.parameters"},
		},
		{name: "claim delete is not validated", fixture: "claim-bad-config.json", kind: webhooktest.ClaimGVK, op: admissionv1.Delete},
		{
			// MPS enforces a share; time-slicing would leave it and set the
			// slice of the GPU the other shares run on.
			name: "share with a TimeSlicing GpuConfig", fixture: "claim-share-timeslicing.json", kind: webhooktest.ClaimGVK,
			wantDenied: []string{
				`spec.devices.config[0].opaque.parameters.sharing.strategy: Invalid value: "TimeSlicing": ` +
					`request "gpu", which names amounts of gpu.prism.dev/compute and gpu.prism.dev/memory, asks for a share of a GPU: ` +
					`a share cannot be time-sliced`,
				"remove the sharing configuration, or the amounts to ask for a whole GPU",
			},
		},
		{name: "share with an Exclusive GpuConfig", fixture: "claim-share-exclusive.json", kind: webhooktest.ClaimGVK},
		{name: "TimeSlicing for the whole GPU of a claim that also holds a share", fixture: "claim-whole-timeslicing.json", kind: webhooktest.ClaimGVK},
		{
			name: "template whose share tier a TimeSlicing GpuConfig reaches", fixture: "template-share-timeslicing.json", kind: webhooktest.TemplateGVK,
			wantDenied: []string{`spec.spec.devices.config[0].opaque.parameters.sharing.strategy: Invalid value: "TimeSlicing": request "gpu/share", which names an amount of gpu.prism.dev/memory, asks for a share of a GPU`},
		},
		{name: "template with TimeSlicing for its whole-GPU tier only", fixture: "template-whole-tier-timeslicing.json", kind: webhooktest.TemplateGVK},
		{
			name: "update that brings a share its TimeSlicing", fixture: "claim-share-timeslicing.json", oldFixture: "claim-share-exclusive.json", kind: webhooktest.ClaimGVK, op: admissionv1.Update,
			wantDenied: []string{"a share cannot be time-sliced"},
		},
		{
			// A claim from before the check must still lose its finalizers.
			name: "update of a share that was time-sliced already", fixture: "claim-share-timeslicing.json", oldFixture: "claim-share-timeslicing.json", kind: webhooktest.ClaimGVK, op: admissionv1.Update,
		},
		{
			name: "template with invalid GpuConfig", fixture: "template-bad-config.json", kind: webhooktest.TemplateGVK,
			wantDenied: []string{"ResourceClaimTemplate.resource.k8s.io", "spec.spec.devices.config[0].opaque.parameters", "profiling.launchCount", "between 1 and 1000"},
		},
		{
			name: "profile annotation on a template's own metadata is a warning", fixture: "template-profile-on-metadata.json", kind: webhooktest.TemplateGVK,
			wantWarning: "prism: prism.dev/profile=train on ResourceClaimTemplate trainer-gpu's own metadata is ignored",
		},
		{name: "profile annotation under a template's spec.metadata", fixture: "template-profile-in-spec.json", kind: webhooktest.TemplateGVK},
		{
			name: "profile annotation on a pod is a warning", fixture: "pod-profile.json", kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			wantWarning: "prism: prism.dev/profile=train on Pod trainer-0 is ignored",
		},
		{name: "valid profile", fixture: "profile-good.json", kind: webhooktest.ProfileGVK},
		{name: "load-aware profile", fixture: "profile-load-aware.json", kind: webhooktest.ProfileGVK},
		{
			name: "invalid profile", fixture: "profile-bad.json", kind: webhooktest.ProfileGVK,
			wantDenied: []string{
				`WorkloadProfile.prism.dev "" is invalid`,
				`spec.minMemory: Invalid value: "2Ti": must be at most 1Ti`,
				`spec.minComputeCapability: Invalid value: "eight": must be "major.minor"`,
				`spec.policy: Unsupported value: "cheapest"`,
				`spec.sharing: Unsupported value: "Sometimes"`,
			},
		},
		{
			name: "zero memory", fixture: "profile-zero-memory.json", kind: webhooktest.ProfileGVK,
			wantDenied: []string{`spec.minMemory: Invalid value: "0": must be greater than zero`},
		},
		{
			// Cmp on this ran for more than ten minutes; the review now
			// refuses it before the profile is decoded.
			name: "memory with a huge exponent", fixture: "profile-huge-exponent.json", kind: webhooktest.ProfileGVK,
			wantDenied: []string{`("1E1111011110") is a quantity beyond what Prism parses`},
		},
		{
			name: "memory above the largest GPU is a warning", fixture: "profile-too-big.json", kind: webhooktest.ProfileGVK,
			wantWarning: "claims that use this profile will not be rewritten",
		},
		{name: "other kinds pass", fixture: "profile-bad.json", kind: metav1.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Deployment"}},
	}
	m, err := webhook.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := tc.op
			if op == "" {
				op = admissionv1.Create
			}
			body := webhooktest.ReviewBody(t, op, tc.kind, webhooktest.ReadFixture(t, tc.fixture))
			if tc.oldFixture != "" {
				body = withOldObject(t, body, webhooktest.ReadFixture(t, tc.oldFixture))
			}
			resp := webhooktest.Call(t, h, body)
			if len(tc.wantDenied) == 0 {
				if !resp.Allowed {
					t.Fatalf("denied: %s", resp.Result.Message)
				}
			} else {
				if resp.Allowed || resp.Result == nil {
					t.Fatalf("allowed, want denial with %q", tc.wantDenied)
				}
				if resp.Result.Reason != metav1.StatusReasonInvalid || resp.Result.Code != 422 {
					t.Errorf("reason %s code %d, want Invalid 422", resp.Result.Reason, resp.Result.Code)
				}
				for _, want := range tc.wantDenied {
					if !strings.Contains(resp.Result.Message, want) {
						t.Errorf("message %q does not contain %q", resp.Result.Message, want)
					}
				}
			}
			warnings := strings.Join(resp.Warnings, "\n")
			if (tc.wantWarning == "") != (warnings == "") || !strings.Contains(warnings, tc.wantWarning) {
				t.Errorf("warnings %q, want %q", warnings, tc.wantWarning)
			}
		})
	}
}

// TestValidatorRefusesAnInvalidProfile: a prism.dev/profile that names no
// WorkloadProfile is refused where claims read it, with a reason that
// quotes at most 64 bytes of it; an update that keeps a claim's value is
// let through, so that a claim from before the check can still be deleted.
func TestValidatorRefusesAnInvalidProfile(t *testing.T) {
	const maxMessage = 1 << 10
	huge := strings.Repeat("p", 200<<10)
	claim := func(profile string) []byte {
		c := resourceapi.ResourceClaim{
			TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaim"},
			ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: webhooktest.Namespace, Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: profile}},
		}
		return marshal(t, c)
	}
	template := func(profile string) []byte {
		tmpl := resourceapi.ResourceClaimTemplate{
			TypeMeta:   metav1.TypeMeta{APIVersion: "resource.k8s.io/v1", Kind: "ResourceClaimTemplate"},
			ObjectMeta: metav1.ObjectMeta{Name: "t", Namespace: webhooktest.Namespace},
		}
		tmpl.Spec.ObjectMeta.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: profile}
		return marshal(t, tmpl)
	}
	tests := []struct {
		name        string
		kind        metav1.GroupVersionKind
		op          admissionv1.Operation
		object, old []byte
		// wantDenied is the start of the denial's message; "" admits.
		wantDenied string
	}{
		{name: "claim naming a profile", kind: webhooktest.ClaimGVK, object: claim("train")},
		{name: "claim naming none", kind: webhooktest.ClaimGVK, object: claim("")},
		{
			name: "claim naming no name", kind: webhooktest.ClaimGVK, object: claim("Train"),
			wantDenied: `ResourceClaim.resource.k8s.io "" is invalid: metadata.annotations[prism.dev/profile]: Invalid value: prism.dev/profile "Train" is not a WorkloadProfile name`,
		},
		{
			name: "claim of 200 KiB", kind: webhooktest.ClaimGVK, object: claim(huge),
			wantDenied: `ResourceClaim.resource.k8s.io "" is invalid: metadata.annotations[prism.dev/profile]: Invalid value: prism.dev/profile "` + huge[:64] + `"... (204800 bytes) is not a WorkloadProfile name: must be no more than 253 characters`,
		},
		{
			name: "update to a value of 200 KiB", kind: webhooktest.ClaimGVK, op: admissionv1.Update, object: claim(huge), old: claim("train"),
			wantDenied: `ResourceClaim.resource.k8s.io "" is invalid: metadata.annotations[prism.dev/profile]: Invalid value: prism.dev/profile "` + huge[:64] + `"...`,
		},
		{name: "update that keeps the claim's value", kind: webhooktest.ClaimGVK, op: admissionv1.Update, object: claim(huge), old: claim(huge)},
		{
			name: "template's claims of 200 KiB", kind: webhooktest.TemplateGVK, object: template(huge),
			wantDenied: `ResourceClaimTemplate.resource.k8s.io "" is invalid: spec.metadata.annotations[prism.dev/profile]: Invalid value: prism.dev/profile "` + huge[:64] + `"... (204800 bytes)`,
		},
		{name: "template's claims naming a profile", kind: webhooktest.TemplateGVK, object: template("train")},
	}
	m, err := webhook.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(m)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			op := tc.op
			if op == "" {
				op = admissionv1.Create
			}
			body := webhooktest.ReviewBody(t, op, tc.kind, tc.object)
			if tc.old != nil {
				body = withOldObject(t, body, tc.old)
			}
			resp := webhooktest.Call(t, h, body)
			if tc.wantDenied == "" {
				if !resp.Allowed {
					t.Fatalf("denied: %.2000s", resp.Result.Message)
				}
				return
			}
			if resp.Allowed || resp.Result == nil {
				t.Fatalf("allowed, want denial with %q", tc.wantDenied)
			}
			if msg := resp.Result.Message; !strings.HasPrefix(msg, tc.wantDenied) || len(msg) > maxMessage {
				t.Errorf("message of %d bytes\n%.2000s\nwant at most %d, starting\n%s", len(msg), msg, maxMessage, tc.wantDenied)
			}
		})
	}
}

// withOldObject is the review body with old as the object an update
// replaces.
func withOldObject(t *testing.T, body, old []byte) []byte {
	t.Helper()
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil {
		t.Fatal(err)
	}
	review.Request.OldObject.Raw = old
	return marshal(t, review)
}

func marshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
