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

// Paths the webhooks are served on; the webhook configurations must use
// them.
const (
	RewritePath  = "/rewrite-resourceclaims"
	ValidatePath = "/validate"
)

// NewMux routes the webhooks.
func NewMux(rewriter, validator, profileWrites, podPreference http.Handler) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle(PodPreferencePath, podPreference)
	mux.Handle(RewritePath, rewriter)
	mux.Handle(ValidatePath, validator)
	mux.Handle(ProfileWritesPath, profileWrites)
	return mux
}

// shutdownGrace is how long in-flight reviews may take after ctx is done.
// Reviews take milliseconds; the margin is for a slow event sink or a
// stalled client. It stays below the pod's default 30s termination grace.
const shutdownGrace = 10 * time.Second

// Serve serves handler over TLS on l until ctx is done, then stops
// accepting connections and lets in-flight reviews finish for up to
// shutdownGrace.
// Request contexts do not inherit ctx's cancellation: a review cut off at
// SIGTERM fails the API server's request, or with failurePolicy Ignore
// admits a claim unrewritten. getCertificate is asked on every handshake,
// so rotated certificates are picked up without a restart.
func Serve(ctx context.Context, l net.Listener, getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), handler http.Handler) error {
	requestCtx := context.WithoutCancel(ctx)
	srv := &http.Server{
		Handler: handler,
		TLSConfig: &tls.Config{
			MinVersion:     tls.VersionTLS12,
			GetCertificate: getCertificate,
		},
		ReadHeaderTimeout: 10 * time.Second,
		// The API server keeps connections open; an idle limit above its
		// own (90s) would make it reuse a connection we are closing.
		IdleTimeout: 60 * time.Second,
		BaseContext: func(net.Listener) context.Context { return requestCtx },
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
