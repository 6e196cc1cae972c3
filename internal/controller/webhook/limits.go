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
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"golang.org/x/sync/semaphore"
	"k8s.io/klog/v2"
)

// What the reviews in flight may hold together. A caller that is not the
// API server can send reviews too (docs/security.md, "Who may call the
// webhooks"), so these bounds hold for any sender; the API server's own
// reviews are far below them.
const (
	// maxReviewSize is above the largest review the API server sends: an
	// update of an object at its request limit (3 MiB) with the old
	// object beside it is refused by etcd's 1.5 MiB object limit first.
	maxReviewSize = 4 << 20
	// reviewOverhead is what a review holds besides its body: the
	// decoded review and object, the answer. A claim decodes to about
	// four times its JSON; 64 KiB covers the small reviews that are the
	// rule, and large ones are weighed by their size.
	reviewOverhead = 64 << 10
	// reviewBudget bounds the bodies (plus overhead) of the reviews in
	// flight: about 180 ordinary reviews, or two at maxReviewSize.
	// A review allocates up to about eight times its body (the body, the
	// review's copy of the object, the decoded object; measured by
	// TestReviewCostIsBoundedByItsSize), so reviews in flight hold at most
	// about 100 MiB, most of it garbage by the time the next arrives.
	reviewBudget = 12 << 20
)

// Deadlines of one review. The API server says how long it waits in the
// request's timeout parameter (the webhook's timeoutSeconds, 1 to 30 s);
// past it nobody reads the answer.
const (
	defaultReviewTimeout = 10 * time.Second
	minReviewTimeout     = time.Second
	maxReviewTimeout     = 30 * time.Second
)

// Reasons a request is refused before its review, the label values of
// prism_webhook_requests_refused_total.
const (
	refusedTooLarge = "too-large"
	refusedBusy     = "busy"
	refusedDeadline = "deadline"
	refusedBody     = "unreadable-body"
	refusedPanic    = "panic"
	// refusedToken: a request whose path does not name the PathToken.
	refusedToken = "no-path-token"
	// refusedObject: a review whose object holds a quantity beyond
	// checkQuantities' bounds, answered without decoding it.
	refusedObject = "costly-object"
)

// limiter bounds what reviews cost together: each waits for its share of
// reviewBudget before its body is read, runs under the deadline its
// request names, and is answered with an error once that passes. Its
// handler keeps its share until it returns, so a review that runs past
// its deadline still counts against the budget.
type limiter struct {
	budget  *semaphore.Weighted
	refused func(reason string)
}

func newLimiter(refused func(reason string)) *limiter {
	return &limiter{budget: semaphore.NewWeighted(reviewBudget), refused: refused}
}

type refusalsKey struct{}

// refused counts a refusal that a handler behind a limiter decides.
func refused(ctx context.Context, reason string) {
	if count, ok := ctx.Value(refusalsKey{}).(func(string)); ok {
		count(reason)
	}
}

// reviewTimeout is the request's deadline: the API server's timeout
// parameter, within bounds.
func reviewTimeout(r *http.Request) time.Duration {
	d, err := time.ParseDuration(r.URL.Query().Get("timeout"))
	if err != nil {
		return defaultReviewTimeout
	}
	return min(max(d, minReviewTimeout), maxReviewTimeout)
}

func (l *limiter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		logger := klog.FromContext(r.Context())
		refuse := func(reason string, code int, msg string) {
			l.refused(reason)
			logger.V(2).Info("Refusing review", "reason", reason, "remote", r.RemoteAddr, "detail", msg)
			http.Error(w, msg, code)
		}
		if r.ContentLength > maxReviewSize {
			refuse(refusedTooLarge, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes exceeds %d", r.ContentLength, maxReviewSize))
			return
		}
		size := r.ContentLength
		if size < 0 {
			size = maxReviewSize
		}
		weight := size + reviewOverhead

		ctx, cancel := context.WithTimeout(context.WithValue(r.Context(), refusalsKey{}, l.refused), reviewTimeout(r))
		defer cancel()
		if err := l.budget.Acquire(ctx, weight); err != nil {
			refuse(refusedBusy, http.StatusServiceUnavailable, "too many reviews in flight")
			return
		}
		release := func() { l.budget.Release(weight) }

		deadline, _ := ctx.Deadline()
		_ = http.NewResponseController(w).SetReadDeadline(deadline)
		body, err := readBody(w, r, size)
		if err != nil {
			release()
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				refuse(refusedTooLarge, http.StatusRequestEntityTooLarge, err.Error())
			} else {
				refuse(refusedBody, http.StatusBadRequest, "reading request body: "+err.Error())
			}
			return
		}

		answer := &bufferedResponse{header: http.Header{}}
		done := make(chan struct{})
		go func() {
			defer close(done)
			defer release()
			defer func() {
				if p := recover(); p != nil {
					logger.Error(fmt.Errorf("%v", p), "Review panicked")
					answer.panicked = true
				}
			}()
			req := r.Clone(ctx)
			req.Body = io.NopCloser(bytes.NewReader(body))
			h.ServeHTTP(answer, req)
		}()
		select {
		case <-done:
			if answer.panicked {
				refuse(refusedPanic, http.StatusInternalServerError, "review failed")
				return
			}
			answer.writeTo(w)
		case <-ctx.Done():
			refuse(refusedDeadline, http.StatusServiceUnavailable, "review did not finish within its deadline")
		}
	})
}

// readBody reads the request's body, at most maxReviewSize bytes.
func readBody(w http.ResponseWriter, r *http.Request, size int64) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(int(size) + bytes.MinRead)
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxReviewSize))
	return buf.Bytes(), err
}

// bufferedResponse holds a handler's answer until the limiter knows it
// came in time; the handler never touches the connection.
type bufferedResponse struct {
	header   http.Header
	code     int
	body     bytes.Buffer
	panicked bool
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(code int) {
	if b.code == 0 {
		b.code = code
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	return b.body.Write(p)
}

func (b *bufferedResponse) writeTo(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	if b.code == 0 {
		b.code = http.StatusOK
	}
	w.WriteHeader(b.code)
	_, _ = w.Write(b.body.Bytes())
}
