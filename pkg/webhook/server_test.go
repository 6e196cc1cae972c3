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
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

// A review in flight at SIGTERM is answered, not cut off: its context
// survives the server's.
func TestServeDrainsInFlightReviews(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	certs := newTestCerts(t, "")

	entered, release := make(chan struct{}), make(chan struct{})
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-release
		if err := r.Context().Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("answered"))
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, l, certs.GetCertificate, handler) }()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certs.CABundle())
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	type result struct {
		status int
		body   string
		err    error
	}
	answered := make(chan result, 1)
	go func() {
		resp, err := client.Post("https://"+l.Addr().String()+ValidatePath, "application/json", nil)
		if err != nil {
			answered <- result{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- result{status: resp.StatusCode, body: string(body), err: err}
	}()

	<-entered
	cancel() // SIGTERM
	close(release)
	if r := <-answered; r.err != nil || r.status != http.StatusOK || r.body != "answered" {
		t.Errorf("in-flight review got status %d, body %q, error %v; want it answered", r.status, r.body, r.err)
	}
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
