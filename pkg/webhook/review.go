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

// maxReviewSize is above the API server's own request limit (3 MiB), so
// anything larger did not come from it.
const maxReviewSize = 4 << 20

// ReviewFunc answers one admission request. It must return a response; the
// UID is filled in by the caller.
type ReviewFunc func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse

// ReviewHandler is the HTTP side of a webhook: it decodes the
// AdmissionReview, calls review and encodes the answer. It is written
// against net/http and encoding/json directly because the webhook sits on
// the claim creation path and every allocation shows up in its latency.
// NewMux names each webhook's logger and times its reviews.
func ReviewHandler(review ReviewFunc) http.Handler {
	return reviewHandler(review)
}

type reviewHandler ReviewFunc

func (review reviewHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
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
	resp := review(klog.NewContext(r.Context(), logger), req)
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
