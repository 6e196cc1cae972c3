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

// Package webhooktest sends the webhooks' handlers admission reviews the
// way the API server does, built from a test's fixtures, and reads their
// answers.
package webhooktest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// Kinds the webhooks review.
var (
	ClaimGVK    = metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"}
	TemplateGVK = metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaimTemplate"}
	ProfileGVK  = metav1.GroupVersionKind{Group: "prism.dev", Version: "v1alpha1", Kind: "WorkloadProfile"}
	PodGVK      = metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}
)

// UID is the UID of every review ReviewBody builds; Call checks that the
// answer echoes it.
const UID = "3c1f7a0e"

// Namespace is where the reviewed objects and Profile's profiles live.
const Namespace = "ml"

// ReadFixture reads testdata/name of the test's package.
func ReadFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// ReviewBody is an AdmissionReview of object, an object of kind in
// Namespace, for operation op.
func ReviewBody(t testing.TB, op admissionv1.Operation, kind metav1.GroupVersionKind, object []byte) []byte {
	t.Helper()
	resource := metav1.GroupVersionResource{Group: kind.Group, Version: kind.Version, Resource: strings.ToLower(kind.Kind) + "s"}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: UID, Kind: kind, Resource: resource, Operation: op,
			Namespace: Namespace, Object: runtime.RawExtension{Raw: object},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// Call posts body to h and returns its answer, failing the test on
// anything but a well-formed answer to review UID.
func Call(t testing.TB, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("decoding response: %v", err)
	}
	if out.Response == nil || out.Response.UID != UID {
		t.Fatalf("response missing or UID not echoed: %+v", out.Response)
	}
	return out.Response
}

// Profile is a WorkloadProfile in Namespace, as mutate leaves it.
func Profile(name string, mutate func(*prismv1alpha1.WorkloadProfile)) *prismv1alpha1.WorkloadProfile {
	wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: Namespace}}
	mutate(wp)
	return wp
}

// Reader reads objs, WorkloadProfiles and resource.k8s.io objects, the
// way the controller's informer cache does.
func Reader(t testing.TB, objs ...client.Object) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := resourceapi.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// PatchedAs applies the response's JSON patch to object and decodes the
// result as a T.
func PatchedAs[T any](t testing.TB, object []byte, resp *admissionv1.AdmissionResponse) *T {
	t.Helper()
	if resp.PatchType == nil || *resp.PatchType != admissionv1.PatchTypeJSONPatch {
		t.Fatalf("patch type %v, want JSONPatch", resp.PatchType)
	}
	p, err := jsonpatch.DecodePatch(resp.Patch)
	if err != nil {
		t.Fatalf("decoding patch %s: %v", resp.Patch, err)
	}
	out, err := p.Apply(object)
	if err != nil {
		t.Fatalf("applying patch %s: %v", resp.Patch, err)
	}
	obj := new(T)
	if err := json.Unmarshal(out, obj); err != nil {
		t.Fatal(err)
	}
	return obj
}
