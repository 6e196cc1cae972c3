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
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	return CallContext(t.Context(), t, h, body)
}

// CallContext is Call with the request's context, such as one with the
// deadline that the webhook server derives from the API server's timeout.
func CallContext(ctx context.Context, t testing.TB, h http.Handler, body []byte) *admissionv1.AdmissionResponse {
	t.Helper()
	resp, err := call(ctx, h, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func call(ctx context.Context, h http.Handler, body []byte) (*admissionv1.AdmissionResponse, error) {
	rec := httptest.NewRecorder()
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", rec.Code, rec.Body)
	}
	var out admissionv1.AdmissionReview
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		return nil, fmt.Errorf("decoding response: %w", err)
	}
	if out.Response == nil || out.Response.UID != UID {
		return nil, fmt.Errorf("response missing or UID not echoed: %+v", out.Response)
	}
	return out.Response, nil
}

// InFlight is a review posted in the background, for a handler that may
// wait before it answers.
type InFlight struct {
	t        testing.TB
	answered chan *admissionv1.AdmissionResponse
	err      chan error
}

// Post posts body to h in the background, with the request's context ctx.
func Post(ctx context.Context, t testing.TB, h http.Handler, body []byte) *InFlight {
	r := &InFlight{t: t, answered: make(chan *admissionv1.AdmissionResponse, 1), err: make(chan error, 1)}
	go func() {
		resp, err := call(ctx, h, body)
		if err != nil {
			r.err <- err
			return
		}
		r.answered <- resp
	}()
	return r
}

// NotAnsweredWithin fails the test if the review is answered within d.
func (r *InFlight) NotAnsweredWithin(d time.Duration, why string) {
	r.t.Helper()
	select {
	case resp := <-r.answered:
		r.t.Fatalf("answered %s: %+v", why, resp)
	case err := <-r.err:
		r.t.Fatal(err)
	case <-time.After(d):
	}
}

// Answer waits for the answer, failing the test on anything but a
// well-formed answer to review UID within 10 s.
func (r *InFlight) Answer() *admissionv1.AdmissionResponse {
	r.t.Helper()
	select {
	case resp := <-r.answered:
		return resp
	case err := <-r.err:
		r.t.Fatal(err)
	case <-time.After(10 * time.Second):
		r.t.Fatal("no answer within 10s")
	}
	return nil
}

// Verdict is what a mutating webhook's answer decides: whether the object
// is admitted, and the patch.
type Verdict struct {
	Allowed bool
	Patch   string
}

// VerdictOf is the answer's verdict.
func VerdictOf(resp *admissionv1.AdmissionResponse) Verdict {
	return Verdict{Allowed: resp.Allowed, Patch: string(resp.Patch)}
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
