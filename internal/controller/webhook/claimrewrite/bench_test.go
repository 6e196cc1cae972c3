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

package claimrewrite

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/servingcert"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
)

// newBenchRewriter uses client-go's real event recorder, with nothing
// consuming the events, so its cost is in the numbers; the fake recorder
// blocks once its buffer is full.
func newBenchRewriter(b *testing.B) http.Handler {
	b.Helper()
	m, err := NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	broadcaster := record.NewBroadcaster()
	b.Cleanup(broadcaster.Shutdown)
	h, err := New(Options{
		Profiles: fakeReader(b, memoryBound), Policy: prismv1alpha1.PolicyPerformance, AutoProfile: true, Metrics: m,
		Recorder: broadcaster.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "prism-controller"}),
	})
	if err != nil {
		b.Fatal(err)
	}
	return h
}

// reportPercentiles adds p50 and p99 of the samples to the benchmark
// output; the mean that ns/op shows hides the tail the API server's
// timeout cares about.
func reportPercentiles(b *testing.B, samples []time.Duration, unit string, scale time.Duration) {
	b.Helper()
	if len(samples) == 0 {
		return
	}
	slices.Sort(samples)
	at := func(q float64) float64 {
		return float64(samples[min(len(samples)-1, int(q*float64(len(samples))))]) / float64(scale)
	}
	b.ReportMetric(at(0.50), "p50-"+unit)
	b.ReportMetric(at(0.99), "p99-"+unit)
}

// BenchmarkAdmission measures the mutating handler in process: decoding
// the AdmissionReview, the profile lookup, the rewrite and encoding the
// patch. The profile reader is controller-runtime's fake client, which
// deep-copies like the informer cache does.
func BenchmarkAdmission(b *testing.B) {
	for _, bc := range []struct{ name, fixture string }{
		{"rewrite", "claim-profiled.json"},
		{"autoprofile", "claim-unknown-profile.json"},
		{"no-annotation", "claim-plain.json"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newBenchRewriter(b)
			body := webhooktest.ReviewBody(b, admissionv1.Create, webhooktest.ClaimGVK, webhooktest.ReadFixture(b, bc.fixture))
			samples := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				start := time.Now()
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodPost, webhook.RewritePath, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				h.ServeHTTP(rec, req)
				samples = append(samples, time.Since(start))
				if rec.Code != http.StatusOK {
					b.Fatalf("status %d", rec.Code)
				}
			}
			reportPercentiles(b, samples, "µs", time.Microsecond)
		})
	}
}

// BenchmarkAdmissionTLS measures the HTTPS round trip through a loopback
// listener with a self-signed certificate, at a fixed rate of 200 requests
// per second (what a burst of pods creating claims looks like), so that
// latency is measured under load rather than back to back. Each iteration
// is one request; run it with -benchtime=1000x for 5 seconds. At most 2000
// requests are sent whatever b.N is.
func BenchmarkAdmissionTLS(b *testing.B) {
	const rate = 200
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), klog.Background().V(10)))
	defer cancel()

	dir := b.TempDir()
	certs, err := servingcert.NewSelfSigned(ctx, servingcert.Options{Dir: dir, ServiceName: "prism-controller", Namespace: "prism", ExtraSANs: []string{"127.0.0.1"}})
	if err != nil {
		b.Fatal(err)
	}
	rw := newBenchRewriter(b)
	m, err := webhook.NewMetrics(nil)
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	served := make(chan error, 1)
	go func() {
		// Only the rewrite webhook is asked.
		other := http.NotFoundHandler()
		served <- webhook.Serve(ctx, l, webhook.ServerTLS(certs.GetCertificate, nil), webhook.NewMux(m, nil, rw, other, other, other))
	}()

	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certs.CABundle())
	client := &http.Client{
		Timeout:   10 * time.Second, // the API server's webhook timeout
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true},
	}
	url := "https://" + l.Addr().String() + webhook.RewritePath
	body := webhooktest.ReviewBody(b, admissionv1.Create, webhooktest.ClaimGVK, webhooktest.ReadFixture(b, "claim-profiled.json"))
	post := func() (time.Duration, error) {
		start := time.Now()
		resp, err := client.Post(url, "application/json", bytes.NewReader(body))
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			return 0, err
		}
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
		return time.Since(start), nil
	}
	if _, err := post(); err != nil { // handshake outside the measurement
		b.Fatal(err)
	}

	n := min(b.N, 10*rate)
	results := make(chan time.Duration, n)
	errs := make(chan error, n)
	ticker := time.NewTicker(time.Second / rate)
	defer ticker.Stop()
	b.ResetTimer()
	for range n {
		<-ticker.C
		go func() {
			d, err := post()
			if err != nil {
				errs <- err
				return
			}
			results <- d
		}()
	}
	samples := make([]time.Duration, 0, n)
	for range n {
		select {
		case d := <-results:
			samples = append(samples, d)
		case err := <-errs:
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportPercentiles(b, samples, "ms", time.Millisecond)
	slices.Sort(samples)
	b.Logf("%d requests at %d/s over TLS: p50 %s, p99 %s, max %s", n, rate, samples[n/2], samples[min(n-1, n*99/100)], samples[n-1])
	cancel()
	if err := <-served; err != nil {
		b.Fatal(err)
	}
}
