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
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/controller/servingcert"
	"github.com/prismgpu/prism/internal/controller/servingcert/certtest"
)

// A review in flight at SIGTERM is answered, not cut off: its context
// survives the server's.
func TestServeDrainsInFlightReviews(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

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
	srv := start(ctx, t, nil, handler, serverTimeouts)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: srv.roots, MinVersion: tls.VersionTLS12}}}
	type result struct {
		status int
		body   string
		err    error
	}
	answered := make(chan result, 1)
	go func() {
		resp, err := client.Post("https://"+srv.addr+ValidatePath, "application/json", nil)
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
	srv.wait(t)
}

// A client that sends its headers and then trickles the body, a byte at a
// time, is cut off once the read timeout has passed, instead of holding a
// connection and a goroutine for as long as it likes.
func TestServeCutsOffATrickledBody(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// The body would take 5 s to arrive, ten times the read timeout: a
	// server that reads it to the end has no read timeout at all.
	const bodySize, interval = 250, 20 * time.Millisecond
	short := timeouts{readHeader: 500 * time.Millisecond, read: 500 * time.Millisecond, write: 5 * time.Second, idle: 5 * time.Second}
	type read struct {
		n   int64
		err error
	}
	reads := make(chan read, 1)
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		reads <- read{n, err}
	})
	srv := start(ctx, t, nil, handler, short)
	conn, err := tls.Dial("tcp", srv.addr, &tls.Config{RootCAs: srv.roots, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: prism\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", ValidatePath, bodySize); err != nil {
		t.Fatal(err)
	}
	sent := make(chan int, 1)
	go func() {
		n := 0
		for ; n < bodySize; n++ {
			if _, err := conn.Write([]byte(" ")); err != nil {
				break
			}
			time.Sleep(interval)
		}
		sent <- n
	}()

	if r := <-reads; r.err == nil {
		t.Errorf("the handler read all %d bytes of a body trickled over %v; want the read cut off after %v", r.n, bodySize*interval, short.read)
	}
	if n := <-sent; n == bodySize {
		t.Errorf("the client sent the whole body over %v; want the connection closed after %v", bodySize*interval, short.read)
	}
	cancel()
	srv.wait(t)
}

// writeFile replaces path the way the kubelet updates a mounted
// ConfigMap: a new file renamed over the old one.
func writeFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// forgedReview asks for the plan of a claim in another tenant's
// namespace, as anyone who reaches the webhook port could.
const forgedReview = `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged","namespace":"other-tenant",` +
	`"kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"operation":"CREATE",` +
	`"object":{"metadata":{"name":"c","namespace":"other-tenant","annotations":{"prism.dev/profile":"their-model"}}}}}`

// With client CAs configured, a review from a client without a
// certificate of theirs (a forged AdmissionReview from a pod) is refused
// in the TLS handshake, before any handler runs; the API server's
// certificate is served. A changed CA file takes effect at the next
// connection.
func TestServeRequiresAClientCertificateOfTheClientCAs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	apiServerCA, otherCA := certtest.NewCA(t, "API server client CA"), certtest.NewCA(t, "another CA")
	apiServer, other := apiServerCA.Client(t, "kube-apiserver"), otherCA.Client(t, "someone")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, apiServerCA.PEM())
	clientCAs, err := LoadClientCAs(ctx, caFile)
	if err != nil {
		t.Fatal(err)
	}

	var handled atomic.Int32
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		handled.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = w.Write([]byte("served"))
	})
	srv := start(ctx, t, clientCAs, handler, serverTimeouts)
	// post sends the forged review on a new connection, with the client
	// certificate if one is given, and says what came back.
	post := func(cert *tls.Certificate, tlsVersion uint16) string {
		cfg := &tls.Config{RootCAs: srv.roots, MinVersion: tlsVersion, MaxVersion: tlsVersion}
		if cert != nil {
			// Presented whatever CAs the server names, as a forger would.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		resp, err := client.Post("https://"+srv.addr+RewritePath, "application/json", strings.NewReader(forgedReview))
		if err != nil {
			return "refused"
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return fmt.Sprintf("%d %s", resp.StatusCode, body)
	}
	type result struct {
		Client, TLS, Answer string
		Handled             int32
	}
	check := func(step string, want []result) {
		t.Helper()
		var got []result
		for _, tc := range []struct {
			name string
			cert *tls.Certificate
		}{{"no certificate", nil}, {"the API server's", &apiServer}, {"another CA's", &other}} {
			for _, v := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
				before := handled.Load()
				answer := post(tc.cert, v)
				got = append(got, result{Client: tc.name, TLS: tls.VersionName(v), Answer: answer, Handled: handled.Load() - before})
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: answers (-want +got):\n%s", step, diff)
		}
	}
	refused := func(client, v string) result { return result{Client: client, TLS: v, Answer: "refused"} }
	servedTo := func(client, v string) result { return result{Client: client, TLS: v, Answer: "200 served", Handled: 1} }

	check("the API server's CA", []result{
		refused("no certificate", "TLS 1.2"), refused("no certificate", "TLS 1.3"),
		servedTo("the API server's", "TLS 1.2"), servedTo("the API server's", "TLS 1.3"),
		refused("another CA's", "TLS 1.2"), refused("another CA's", "TLS 1.3"),
	})

	writeFile(t, caFile, otherCA.PEM())
	check("the file replaced by another CA", []result{
		refused("no certificate", "TLS 1.2"), refused("no certificate", "TLS 1.3"),
		refused("the API server's", "TLS 1.2"), refused("the API server's", "TLS 1.3"),
		servedTo("another CA's", "TLS 1.2"), servedTo("another CA's", "TLS 1.3"),
	})

	// A file that no longer parses leaves the CAs read before.
	writeFile(t, caFile, []byte("not a certificate\n"))
	check("the file broken", []result{
		refused("no certificate", "TLS 1.2"), refused("no certificate", "TLS 1.3"),
		refused("the API server's", "TLS 1.2"), refused("the API server's", "TLS 1.3"),
		servedTo("another CA's", "TLS 1.2"), servedTo("another CA's", "TLS 1.3"),
	})

	cancel()
	srv.wait(t)
}

// Without client CAs, any client is served: the default, for clusters
// whose API server presents no client certificate.
func TestServeWithoutClientCAsServesAnyClient(t *testing.T) {
	if cfg := ServerTLS(nil, nil); cfg.ClientAuth != tls.NoClientCert {
		t.Errorf("ClientAuth = %v, want NoClientCert", cfg.ClientAuth)
	}
}

// A client CA file that is missing or holds no certificate stops the
// start-up rather than leaving the webhooks open.
func TestLoadClientCAsRefusesAFileWithoutCertificates(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.crt")
	writeFile(t, empty, []byte("# no certificate here\n"))
	for _, path := range []string{filepath.Join(dir, "missing.crt"), empty} {
		if _, err := LoadClientCAs(ctx, path); err == nil {
			t.Errorf("LoadClientCAs(%s): no error", filepath.Base(path))
		}
	}
}

// testServer is serve on a loopback port, with a serving certificate for
// 127.0.0.1.
type testServer struct {
	addr  string
	roots *x509.CertPool // trusts the serving certificate
	done  chan error
}

// start serves handler until ctx is done.
func start(ctx context.Context, t *testing.T, clientCAs *ClientCAs, handler http.Handler, to timeouts) testServer {
	t.Helper()
	certs, err := servingcert.NewSelfSigned(ctx, servingcert.Options{ServiceName: "prism-controller", Namespace: "prism", ExtraSANs: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := testServer{addr: l.Addr().String(), roots: x509.NewCertPool(), done: make(chan error, 1)}
	srv.roots.AppendCertsFromPEM(certs.CABundle())
	go func() { srv.done <- serve(ctx, l, ServerTLS(certs.GetCertificate, clientCAs), handler, to) }()
	return srv
}

// wait waits for serve to return, once ctx is done.
func (srv testServer) wait(t *testing.T) {
	t.Helper()
	if err := <-srv.done; err != nil {
		t.Errorf("Serve: %v", err)
	}
}
