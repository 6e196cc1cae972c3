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

package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
)

// ReviewFunc answers one admission request. It must return a response; the
// UID is filled in by the caller.
type ReviewFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// RefuseFunc answers a request whose object Prism will not decode (see
// checkQuantities); err says why. Deny is the answer of a validating
// webhook; a mutating one that must never block an object admits it
// unchanged.
type RefuseFunc func(ctx context.Context, req *admissionv1.AdmissionRequest, err error) *admissionv1.AdmissionResponse

// Deny refuses the object with err as the reason.
func Deny(_ context.Context, _ *admissionv1.AdmissionRequest, err error) *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity, Reason: metav1.StatusReasonInvalid, Message: err.Error(),
	}}
}

// AdmitUnchanged admits the object without changes: the answer of a
// mutating webhook that never blocks an object.
func AdmitUnchanged(context.Context, *admissionv1.AdmissionRequest, error) *admissionv1.AdmissionResponse {
	return Allowed()
}

// ReviewHandler is the HTTP side of a webhook: it decodes the
// AdmissionReview, checks that its objects are cheap to decode, calls
// review (or refuse) and encodes the answer. It is written against
// net/http and encoding/json directly because the webhook sits on the
// claim creation path and every allocation shows up in its latency.
// NewMux names each webhook's logger, times its reviews and bounds what
// they may cost together.
func ReviewHandler(review ReviewFunc, refuse RefuseFunc) http.Handler {
	return reviewHandler{review: review, refuse: refuse}
}

type reviewHandler struct {
	review ReviewFunc
	refuse RefuseFunc
}

func (h reviewHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	logger := klog.FromContext(r.Context())

	if r.Method != http.MethodPost {
		http.Error(w, "only POST is supported", http.StatusMethodNotAllowed)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		http.Error(w, fmt.Sprintf("content type %q is not supported, expected application/json", ct), http.StatusUnsupportedMediaType)
		return
	}
	var in admissionv1.AdmissionReview
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReviewSize)).Decode(&in); err != nil {
		logger.Error(err, "Decoding AdmissionReview")
		http.Error(w, "decoding AdmissionReview: "+err.Error(), http.StatusBadRequest)
		return
	}
	if in.Request == nil {
		http.Error(w, "AdmissionReview has no request", http.StatusBadRequest)
		return
	}
	req := in.Request
	logger = logger.WithValues("uid", req.UID, "kind", req.Kind.Kind, "namespace", req.Namespace, "name", req.Name, "operation", req.Operation)
	ctx := klog.NewContext(r.Context(), logger)
	var resp *admissionv1.AdmissionResponse
	if err := checkObjects(req); err != nil {
		logger.Info("Refusing to decode the reviewed object", "reason", err)
		refused(r.Context(), refusedObject)
		resp = h.refuse(ctx, req, err)
	} else {
		resp = h.review(ctx, req)
	}
	resp.UID = req.UID

	out := admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: admissionv1.SchemeGroupVersion.String(), Kind: "AdmissionReview"},
		Response: resp,
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(&out); err != nil {
		// The connection is gone or broken; the API server applies the
		// failure policy.
		logger.Error(err, "Writing AdmissionReview response")
	}
}

// checkObjects checks the object and the old object of req.
func checkObjects(req *admissionv1.AdmissionRequest) error {
	if err := checkQuantities(req.Object.Raw); err != nil {
		return fmt.Errorf("object: %w", err)
	}
	if err := checkQuantities(req.OldObject.Raw); err != nil {
		return fmt.Errorf("old object: %w", err)
	}
	return nil
}

// Allowed admits without changes.
func Allowed() *admissionv1.AdmissionResponse {
	return &admissionv1.AdmissionResponse{Allowed: true}
}

// PatchOp is one RFC 6902 operation.
type PatchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// AnnotationPath is the JSON pointer (RFC 6901) to the annotation key of
// the reviewed object.
func AnnotationPath(key string) string {
	return "/metadata/annotations/" + strings.ReplaceAll(strings.ReplaceAll(key, "~", "~0"), "/", "~1")
}

// Patched admits with a JSON patch.
func Patched(ops []PatchOp) (*admissionv1.AdmissionResponse, error) {
	data, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding JSON patch: %w", err)
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: data, PatchType: &pt}, nil
}
