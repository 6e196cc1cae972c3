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
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"k8s.io/klog/v2"
)

// Names of the webhook configurations the chart installs, which the
// controller keeps a caBundle in when it signs its own certificates.
const (
	MutatingConfigName   = "prism-rewrite"
	ValidatingConfigName = "prism-validate"
)

// Paths the webhooks are served on; the webhook configurations must use
// them.
const (
	RewritePath  = "/rewrite-resourceclaims"
	ValidatePath = "/validate"
	// ProfileWritesPath is where the API server sends the kubelet plugin's
	// WorkloadProfile writes (the webhook configuration matches on its
	// ServiceAccount). Every request here is checked against the writer's
	// node.
	ProfileWritesPath = "/validate-profile-writes"
	// PodPreferencePath is where the pod webhook is served.
	PodPreferencePath = "/mutate-pods"
)

// NewMux routes the webhooks. Each gets a logger of its name, and its
// reviews are timed under that name in metrics. Each is served on its path
// and on its path followed by a token: with token, only requests that name
// the token it knows are reviewed (nil: only the plain paths). All of them
// share one limiter: what their reviews in flight hold together is
// bounded, and each review is answered by its deadline.
func NewMux(metrics *Metrics, token *PathToken, rewriter, validator, profileWrites, podPreference http.Handler) *http.ServeMux {
	limit := newLimiter(metrics.refusedRequest)
	mux := http.NewServeMux()
	for _, w := range []struct {
		path, name string
		h          http.Handler
	}{
		{PodPreferencePath, "pod-preference", podPreference},
		{RewritePath, "rewrite", rewriter},
		{ValidatePath, "validate", validator},
		{ProfileWritesPath, "profile-writes", profileWrites},
	} {
		h := metrics.named(w.name, token.guard(metrics.refusedRequest, limit.wrap(w.h)))
		mux.Handle(w.path, h)
		mux.Handle(w.path+"/{token}", h)
	}
	return mux
}

// shutdownGrace is how long in-flight reviews may take after ctx is done.
// Reviews take milliseconds; the margin is for a slow event sink or a
// stalled client. It stays below the pod's default 30s termination grace.
const shutdownGrace = 10 * time.Second

// Timeouts of the webhook server. The API server sends a review in one
// write and waits at most its webhook timeout (timeoutSeconds, 1 to 30 s;
// the chart's default is 5 s) for the answer, so a client slower than
// these is not the API server.
type timeouts struct {
	// readHeader bounds the TLS handshake and the request's headers, read
	// the headers and the body together: a client that trickles a body
	// holds a connection and a goroutine for read at most. They are
	// equal because the API server writes headers and body at once, and
	// a review of the largest object it stores (3 MiB) crosses a cluster
	// network in milliseconds: the body needs no time of its own.
	readHeader, read time.Duration
	// write runs from the end of the headers to the end of the answer:
	// past 30 s no API server is still waiting for it.
	write time.Duration
	// idle: the API server keeps connections open; an idle limit above
	// its own (90s) would make it reuse a connection we are closing.
	idle time.Duration
}

var serverTimeouts = timeouts{readHeader: 10 * time.Second, read: 10 * time.Second, write: 30 * time.Second, idle: 60 * time.Second}

// Serve serves handler over TLS on l, with tlsConfig from ServerTLS, until
// ctx is done, then stops accepting connections and lets in-flight reviews
// finish for up to shutdownGrace.
// Request contexts do not inherit ctx's cancellation: a review cut off at
// SIGTERM fails the API server's request, or with failurePolicy Ignore
// admits a claim unrewritten. What reviews may cost is bounded by
// NewMux's limiter.
func Serve(ctx context.Context, l net.Listener, tlsConfig *tls.Config, handler http.Handler) error {
	return serve(ctx, l, tlsConfig, handler, serverTimeouts)
}

func serve(ctx context.Context, l net.Listener, tlsConfig *tls.Config, handler http.Handler, t timeouts) error {
	requestCtx := context.WithoutCancel(ctx)
	srv := &http.Server{
		Handler:           handler,
		TLSConfig:         tlsConfig,
		ReadHeaderTimeout: t.readHeader,
		ReadTimeout:       t.read,
		WriteTimeout:      t.write,
		IdleTimeout:       t.idle,
		BaseContext:       func(net.Listener) context.Context { return requestCtx },
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(requestCtx, shutdownGrace)
		defer cancel()
		if err := srv.Shutdown(shutdownCtx); err != nil {
			klog.FromContext(ctx).Error(err, "Draining webhook requests", "grace", shutdownGrace)
		}
	}()
	klog.FromContext(ctx).Info("Serving webhooks", "address", l.Addr().String())
	err := srv.ServeTLS(l, "", "")
	if errors.Is(err, http.ErrServerClosed) {
		<-done
		return nil
	}
	return fmt.Errorf("serving webhooks on %s: %w", l.Addr(), err)
}
