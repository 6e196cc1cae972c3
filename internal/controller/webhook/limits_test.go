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
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/prismgpu/prism/internal/metricstest"
)

// limitedMux serves review on every path of NewMux and returns it with
// its metrics.
func limitedMux(t *testing.T, h http.Handler) (*http.ServeMux, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	return NewMux(m, nil, h, h, h, h), m
}

func refusals(t *testing.T, m *Metrics) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.refused)
	return metricstest.Counters(t, reg, "prism_webhook_requests_refused_total", "reason")
}

// reviewOf wraps a ResourceClaim's JSON, as the API server sends it.
func reviewOf(claim string) []byte {
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"resource":{"group":"resource.k8s.io","version":"v1","resource":"resourceclaims"},"operation":"CREATE","namespace":"ml","object":` + claim + `}}`)
}

// decodingReview decodes the claim as the real webhooks do, so that a
// quantity the check let through costs what it costs.
func decodingReview(_ context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(req.Object.Raw, &claim); err != nil {
		return Deny(nil, req, err)
	}
	return Allowed()
}

// hostileClaim is a claim of about size bytes whose capacity requests are
// all costly quantities.
func hostileClaim(size int) string {
	var b strings.Builder
	b.WriteString(`{"metadata":{"name":"c"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{`)
	for i := 0; b.Len() < size; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"r%d":"1e-99999"`, i)
	}
	b.WriteString(`}}}}]}}}`)
	return b.String()
}

// A review whose object holds a costly quantity is answered without
// decoding the object: a validating webhook denies it with the reason, a
// mutating one admits it unchanged, and neither pays for the parse.
func TestReviewRefusesCostlyQuantities(t *testing.T) {
	for _, tc := range []struct {
		name   string
		refuse RefuseFunc
		want   admissionv1.AdmissionResponse
	}{
		{name: "validating", refuse: Deny, want: admissionv1.AdmissionResponse{UID: "u1", Allowed: false}},
		{name: "mutating", refuse: AdmitUnchanged, want: admissionv1.AdmissionResponse{UID: "u1", Allowed: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reviewed := 0
			mux, m := limitedMux(t, ReviewHandler(func(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
				reviewed++
				return decodingReview(ctx, req)
			}, tc.refuse))
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, RewritePath, bytes.NewReader(reviewOf(hostileClaim(1000)))))
			var out admissionv1.AdmissionReview
			if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
				t.Fatalf("status %d, answer %s: %v", w.Code, w.Body, err)
			}
			got := *out.Response
			if got.Result != nil && !strings.Contains(got.Result.Message, `object: the value at byte`) {
				t.Errorf("denial %q does not say which value", got.Result.Message)
			}
			got.Result = nil
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
			if reviewed != 0 {
				t.Errorf("the review ran %d times on a refused object", reviewed)
			}
			if diff := cmp.Diff(map[string]float64{refusedObject: 1}, refusals(t, m)); diff != "" {
				t.Errorf("refusals (-want +got):\n%s", diff)
			}
		})
	}
}

// What a review may cost in memory: its body, the review decoded around a
// copy of the object, and the object decoded, a small multiple of the
// body, never the hundreds of MiB one costly quantity takes. Counted in
// bytes allocated, which the runtime counts exactly.
func TestReviewCostIsBoundedByItsSize(t *testing.T) {
	const bound = 10 // bytes allocated per byte of body; about 7 measured
	mux, _ := limitedMux(t, ReviewHandler(decodingReview, Deny))
	ordinary := func(size int) string {
		var b strings.Builder
		b.WriteString(`{"metadata":{"name":"c","annotations":{"a":"`)
		b.WriteString(strings.Repeat("x", size))
		b.WriteString(`"}},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{"memory":"40Gi"}}}}]}}}`)
		return b.String()
	}
	for _, tc := range []struct {
		name  string
		claim string
		code  int
	}{
		{"ordinary claim, 1 MiB", ordinary(1 << 20), http.StatusOK},
		{"costly quantities, 1 MiB", hostileClaim(1 << 20), http.StatusOK},
		{"costly quantities, 4 MiB", hostileClaim(maxReviewSize - 1024), http.StatusOK},
		{"over the size limit", hostileClaim(maxReviewSize), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := reviewOf(tc.claim)
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, ValidatePath, bytes.NewReader(body)))
			runtime.ReadMemStats(&after)
			if w.Code != tc.code {
				t.Fatalf("status %d, want %d: %.200s", w.Code, tc.code, w.Body)
			}
			t.Logf("%d bytes allocated for %d bytes of review", after.TotalAlloc-before.TotalAlloc, len(body))
			if got := after.TotalAlloc - before.TotalAlloc; got > bound*uint64(len(body)) {
				t.Errorf("a review of %d bytes allocated %d bytes, more than %d times its size", len(body), got, bound)
			}
		})
	}
}

// Requests beyond the limits are answered at once, without a review.
func TestLimiterRefuses(t *testing.T) {
	panicking := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("review bug") })
	for _, tc := range []struct {
		name    string
		handler http.Handler
		req     func() *http.Request
		code    int
		refused string
	}{
		{
			name:    "a declared body over the limit, before it is read",
			handler: panicking,
			req: func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, RewritePath, strings.NewReader("{}"))
				r.ContentLength = maxReviewSize + 1
				return r
			},
			code: http.StatusRequestEntityTooLarge, refused: refusedTooLarge,
		},
		{
			name:    "an undeclared body over the limit, cut off there",
			handler: panicking,
			req: func() *http.Request {
				r := httptest.NewRequest(http.MethodPost, RewritePath, io.MultiReader(strings.NewReader(strings.Repeat(" ", maxReviewSize)), strings.NewReader("{}")))
				r.ContentLength = -1
				return r
			},
			code: http.StatusRequestEntityTooLarge, refused: refusedTooLarge,
		},
		{
			name:    "a review that panics",
			handler: panicking,
			req: func() *http.Request {
				return httptest.NewRequest(http.MethodPost, RewritePath, strings.NewReader("{}"))
			},
			code: http.StatusInternalServerError, refused: refusedPanic,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux, m := limitedMux(t, tc.handler)
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, tc.req())
			if w.Code != tc.code {
				t.Errorf("status %d, want %d: %s", w.Code, tc.code, w.Body)
			}
			if diff := cmp.Diff(map[string]float64{tc.refused: 1}, refusals(t, m)); diff != "" {
				t.Errorf("refusals (-want +got):\n%s", diff)
			}
		})
	}
}

// A review that runs past the deadline its request names is answered with
// an error then, and keeps its share of the budget until it returns; a
// review that finds the budget taken waits until its own deadline.
func TestLimiterDeadlineAndBudget(t *testing.T) {
	release := make(chan struct{})
	var started sync.WaitGroup
	var block atomic.Bool
	block.Store(true)
	blocking := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if block.Load() {
			started.Done()
			<-r.Context().Done() // the deadline passed
			<-release
		}
		w.WriteHeader(http.StatusOK)
	})
	mux, m := limitedMux(t, blocking)

	// Reviews at the size limit fill the budget; each is cut off at
	// its 1 s deadline but holds its share until its handler returns.
	big := strings.Repeat(" ", maxReviewSize-2) + "{}"
	full := int(reviewBudget / (maxReviewSize + reviewOverhead))
	started.Add(full)
	codes := make(chan int, full)
	for range full {
		go func() {
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, RewritePath+"?timeout=1s", strings.NewReader(big)))
			codes <- w.Code
		}()
	}
	started.Wait()
	for range full {
		if code := <-codes; code != http.StatusServiceUnavailable {
			t.Errorf("a review past its deadline answered %d, want %d", code, http.StatusServiceUnavailable)
		}
	}
	w := httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, RewritePath+"?timeout=1s", strings.NewReader(big)))
	if w.Code != http.StatusServiceUnavailable || !strings.Contains(w.Body.String(), "too many reviews in flight") {
		t.Errorf("with the budget held, a review answered %d %q, want 503 too many reviews in flight", w.Code, w.Body)
	}
	want := map[string]float64{refusedDeadline: float64(full), refusedBusy: 1}
	if diff := cmp.Diff(want, refusals(t, m)); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}

	// Once the cut-off reviews return, the budget is free again: the next
	// review waits for their shares and is served.
	block.Store(false)
	close(release)
	w = httptest.NewRecorder()
	mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, RewritePath+"?timeout=10s", strings.NewReader(big)))
	if w.Code != http.StatusOK {
		t.Errorf("after the held reviews returned, a review answered %d %q, want 200", w.Code, w.Body)
	}
}

func TestReviewTimeout(t *testing.T) {
	for query, want := range map[string]string{
		"":              "10s",
		"?timeout=5s":   "5s",
		"?timeout=10ms": "1s",
		"?timeout=1h":   "30s",
		"?timeout=x":    "10s",
	} {
		if got := reviewTimeout(httptest.NewRequest(http.MethodPost, "/validate"+query, nil)).String(); got != want {
			t.Errorf("timeout of %q: %s, want %s", query, got, want)
		}
	}
}
