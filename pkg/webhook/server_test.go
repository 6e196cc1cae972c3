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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
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

	"github.com/prismgpu/prism/pkg/servingcert"
)

// A review in flight at SIGTERM is answered, not cut off: its context
// survives the server's.
func TestServeDrainsInFlightReviews(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	certs := serverCerts(t)

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
	go func() { served <- Serve(ctx, l, ServerTLS(certs.GetCertificate, nil), handler) }()

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

// A client that sends its headers and then trickles the body, a byte at a
// time, is cut off once the read timeout has passed, instead of holding a
// connection and a goroutine for as long as it likes.
func TestServeCutsOffATrickledBody(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	certs := serverCerts(t)

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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- serve(ctx, l, ServerTLS(certs.GetCertificate, nil), handler, short) }()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certs.CABundle())
	conn, err := tls.Dial("tcp", l.Addr().String(), &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})
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
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
}

// testCA is a CA for client certificates.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return testCA{cert: cert, key: key}
}

// client issues a client certificate, as an API server's admission
// configuration would present.
func (ca testCA) client(t *testing.T, name string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
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
	certs := serverCerts(t)
	apiServerCA, otherCA := newTestCA(t, "API server client CA"), newTestCA(t, "another CA")
	apiServer, other := apiServerCA.client(t, "kube-apiserver"), otherCA.client(t, "someone")
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	writeFile(t, caFile, apiServerCA.pem())
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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- Serve(ctx, l, ServerTLS(certs.GetCertificate, clientCAs), handler) }()

	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(certs.CABundle())
	// post sends the forged review on a new connection, with the client
	// certificate if one is given, and says what came back.
	post := func(cert *tls.Certificate, tlsVersion uint16) string {
		cfg := &tls.Config{RootCAs: roots, MinVersion: tlsVersion, MaxVersion: tlsVersion}
		if cert != nil {
			// Presented whatever CAs the server names, as a forger would.
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
		resp, err := client.Post("https://"+l.Addr().String()+RewritePath, "application/json", strings.NewReader(forgedReview))
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

	writeFile(t, caFile, otherCA.pem())
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
	if err := <-served; err != nil {
		t.Errorf("Serve: %v", err)
	}
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

// serverCerts is a serving certificate for 127.0.0.1.
func serverCerts(t *testing.T) *servingcert.SelfSigned {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	certs, err := servingcert.NewSelfSigned(ctx, servingcert.Options{ServiceName: "prism-controller", Namespace: "prism", ExtraSANs: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	return certs
}

// pem is the CA's certificate as a client-CA file holds it.
func (c testCA) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.cert.Raw})
}
