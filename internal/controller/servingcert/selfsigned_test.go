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

package servingcert

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/controller/servingcert/certtest"
)

// The webhook configurations the tests keep a caBundle in.
const (
	testMutatingName   = "prism-rewrite"
	testValidatingName = "prism-validate"
)

func newTestCerts(t *testing.T, dir string) *SelfSigned {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	s, err := NewSelfSigned(ctx, Options{
		Dir: dir, ServiceName: "prism-controller", Namespace: "prism", ExtraSANs: []string{"127.0.0.1", "localhost"},
		CAValidity: 10 * time.Hour, CertValidity: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func verify(t *testing.T, cert *tls.Certificate, bundle []byte, name string) error {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(bundle) {
		t.Fatal("bundle holds no certificates")
	}
	// Verified in the middle of the certificate's life: rotation tests
	// move the clock.
	at := cert.Leaf.NotBefore.Add(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore) / 2)
	_, err := cert.Leaf.Verify(x509.VerifyOptions{DNSName: name, Roots: pool, CurrentTime: at, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	return err
}

func TestSelfSignedCerts(t *testing.T) {
	dir := t.TempDir()
	s := newTestCerts(t, dir)
	cert, _ := s.GetCertificate(nil)
	for _, name := range []string{"prism-controller.prism.svc", "prism-controller.prism.svc.cluster.local", "127.0.0.1", "localhost"} {
		if err := verify(t, cert, s.CABundle(), name); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := verify(t, cert, s.CABundle(), "evil.example.com"); err == nil {
		t.Error("certificate is valid for a name it was not issued for")
	}
	onDisk, err := tls.LoadX509KeyPair(filepath.Join(dir, CertFile), filepath.Join(dir, KeyFile))
	if err != nil {
		t.Fatalf("files in cert dir: %v", err)
	}
	if !bytes.Equal(onDisk.Certificate[0], cert.Certificate[0]) {
		t.Error("file and served certificate differ")
	}
	if fi, err := os.Stat(filepath.Join(dir, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode: %v %v", fi.Mode(), err)
	}
	if got := rotationTime(cert.Leaf).Sub(cert.Leaf.NotBefore); got != time.Duration(float64(cert.Leaf.NotAfter.Sub(cert.Leaf.NotBefore))*RotateAfter) {
		t.Errorf("rotation after %s", got)
	}
}

func TestSelfSignedCertsRotation(t *testing.T) {
	tests := []struct {
		name        string
		advance     time.Duration
		wantNewCA   bool
		wantNewCert bool
	}{
		{name: "early: nothing due", advance: 30 * time.Minute},
		{name: "serving cert at 85 %", advance: 52 * time.Minute, wantNewCert: true},
		{name: "CA at 85 %", advance: 9 * time.Hour, wantNewCA: true, wantNewCert: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			s := newTestCerts(t, t.TempDir())
			oldCert, _ := s.GetCertificate(nil)
			oldCA := s.currentCA()
			now := time.Now().Add(tc.advance)
			s.now = func() time.Time { return now }
			if s.nextRotation().After(now) {
				if tc.wantNewCert {
					t.Fatalf("rotation not due at +%s", tc.advance)
				}
				return
			}
			published := 0
			err := s.rotate(ctx, func(context.Context) error {
				published++
				// The new CA must be trusted while the old cert is
				// still served, and the old CA must remain.
				served, _ := s.GetCertificate(nil)
				if served != oldCert {
					t.Error("new certificate served before the CA bundle was published")
				}
				if err := verify(t, served, s.CABundle(), "127.0.0.1"); err != nil {
					t.Errorf("old certificate not trusted by the new bundle: %v", err)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if gotNewCA := !s.currentCA().Equal(oldCA); gotNewCA != tc.wantNewCA || (published > 0) != tc.wantNewCA {
				t.Errorf("new CA %v, published %d times, want new CA %v", gotNewCA, published, tc.wantNewCA)
			}
			cert, _ := s.GetCertificate(nil)
			if cert == oldCert {
				t.Fatal("serving certificate not re-issued")
			}
			if err := verify(t, cert, s.CABundle(), "prism-controller.prism.svc"); err != nil {
				t.Errorf("new certificate not trusted: %v", err)
			}
		})
	}
}

func webhookConfigs() []runtime.Object {
	svc := &admissionregistrationv1.ServiceReference{Namespace: "prism", Name: "prism-controller"}
	return []runtime.Object{
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: testMutatingName},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "rewrite.prism.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}}},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: testValidatingName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{
				{Name: "claims.prism.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}},
				{Name: "profiles.prism.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc, CABundle: []byte("reset by helm")}},
			},
		},
	}
}

func bundles(t *testing.T, cs *fake.Clientset) [][]byte {
	t.Helper()
	ctx := context.Background()
	m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, testMutatingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, testValidatingName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return [][]byte{m.Webhooks[0].ClientConfig.CABundle, v.Webhooks[0].ClientConfig.CABundle, v.Webhooks[1].ClientConfig.CABundle}
}

func updates(cs *fake.Clientset) int {
	n := 0
	for _, a := range cs.Actions() {
		if a.GetVerb() == "update" {
			n++
		}
	}
	return n
}

func TestCABundleInjector(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	s := newTestCerts(t, "")
	other := newTestCerts(t, "") // a second replica

	t.Run("configs missing", func(t *testing.T) {
		inj := &CABundleInjector{Client: fake.NewClientset(), MutatingName: testMutatingName, ValidatingName: testValidatingName, Bundle: s.CABundle}
		if err := inj.Sync(ctx); err == nil {
			t.Error("Sync succeeded without webhook configurations")
		}
	})

	cs := fake.NewClientset(webhookConfigs()...)
	inj := &CABundleInjector{Client: cs, MutatingName: testMutatingName, ValidatingName: testValidatingName, Bundle: s.CABundle}
	if err := inj.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	cert, _ := s.GetCertificate(nil)
	for i, b := range bundles(t, cs) {
		if err := verify(t, cert, b, "prism-controller.prism.svc"); err != nil {
			t.Errorf("webhook %d does not trust the serving cert: %v", i, err)
		}
	}

	t.Run("no change, no update", func(t *testing.T) {
		before := updates(cs)
		if err := inj.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if n := updates(cs) - before; n != 0 {
			t.Errorf("%d updates for an unchanged bundle", n)
		}
	})

	t.Run("reset is undone", func(t *testing.T) {
		m, _ := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, testMutatingName, metav1.GetOptions{})
		m.Webhooks[0].ClientConfig.CABundle = nil
		if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Update(ctx, m, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		if err := inj.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := verify(t, cert, bundles(t, cs)[0], "127.0.0.1"); err != nil {
			t.Errorf("reset bundle not restored: %v", err)
		}
	})

	t.Run("replicas merge and converge", func(t *testing.T) {
		inj2 := &CABundleInjector{Client: cs, MutatingName: testMutatingName, ValidatingName: testValidatingName, Bundle: other.CABundle}
		if err := inj2.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		otherCert, _ := other.GetCertificate(nil)
		for i, b := range bundles(t, cs) {
			if verify(t, cert, b, "127.0.0.1") != nil || verify(t, otherCert, b, "127.0.0.1") != nil {
				t.Errorf("webhook %d does not trust both replicas", i)
			}
		}
		before := updates(cs)
		if err := inj.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if err := inj2.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if n := updates(cs) - before; n != 0 {
			t.Errorf("replicas keep rewriting the bundle: %d updates", n)
		}
	})

	t.Run("expired CAs are dropped", func(t *testing.T) {
		inj.now = func() time.Time { return time.Now().Add(11 * time.Hour) }
		defer func() { inj.now = nil }()
		if err := inj.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		certs, err := parseCerts(bundles(t, cs)[0])
		if err != nil || len(certs) != 1 {
			t.Errorf("bundle has %d certificates (%v), want only our own", len(certs), err)
		}
	})
}

// A leaked CA key must not be good for a decade: the defaults are a year
// for the CA and a month for the serving certificate.
func TestSelfSignedCertsDefaultValidity(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	s, err := NewSelfSigned(ctx, Options{ServiceName: "prism-controller", Namespace: "prism", Replica: "prism-controller-7d9f-abcde"})
	if err != nil {
		t.Fatal(err)
	}
	life := func(c *x509.Certificate) time.Duration { return c.NotAfter.Sub(c.NotBefore) - time.Hour } // NotBefore is back-dated an hour
	cert, _ := s.GetCertificate(nil)
	if got := life(s.currentCA()); got > 366*24*time.Hour {
		t.Errorf("CA valid for %s, want at most a year", got)
	}
	if got := life(cert.Leaf); got > 31*24*time.Hour {
		t.Errorf("serving certificate valid for %s, want at most a month", got)
	}
	if replica, ok := caReplica(s.currentCA()); !ok || replica != "prism-controller-7d9f-abcde" {
		t.Errorf("CA names replica %q (Prism CA: %v), want the pod name", replica, ok)
	}
}

func replicaCA(t *testing.T, replica string) *x509.Certificate {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	s, err := NewSelfSigned(ctx, Options{ServiceName: "prism-controller", Namespace: "prism", Replica: replica, CAValidity: 10 * time.Hour, CertValidity: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return s.currentCA()
}

// The bundle trusts the CAs of replicas that exist, and forgets those of
// replicas that are gone once orphanGrace has passed.
func TestCABundleInjectorPrunesGoneReplicas(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ours := replicaCA(t, "ctl-a")
	earlierContainer := replicaCA(t, "ctl-a") // same pod, before a restart
	peer := replicaCA(t, "ctl-b")
	gone := replicaCA(t, "ctl-c")
	untagged := replicaCA(t, "")                           // made by a controller before CAs named their replica
	foreign := certtest.NewCA(t, "someone else's CA").Cert // left alone: not ours to judge

	tests := []struct {
		name     string
		replicas func(context.Context) (sets.Set[string], error)
		// want after the first sync, and after orphanGrace more.
		wantNow, wantLater []*x509.Certificate
	}{
		{
			name:      "gone replicas pruned after the grace",
			replicas:  listed("ctl-a", "ctl-b"),
			wantNow:   []*x509.Certificate{ours, peer, gone, untagged, foreign},
			wantLater: []*x509.Certificate{ours, peer, foreign},
		},
		{
			name:      "listing fails: only the earlier container's CA goes",
			replicas:  func(context.Context) (sets.Set[string], error) { return nil, errors.New("forbidden") },
			wantNow:   []*x509.Certificate{ours, peer, gone, untagged, foreign},
			wantLater: []*x509.Certificate{ours, peer, gone, untagged, foreign},
		},
		{
			name:      "a list without this replica is not trusted",
			replicas:  listed("ctl-b"),
			wantNow:   []*x509.Certificate{ours, peer, gone, untagged, foreign},
			wantLater: []*x509.Certificate{ours, peer, gone, untagged, foreign},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(webhookConfigs()...)
			v, _ := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, testValidatingName, metav1.GetOptions{})
			v.Webhooks[0].ClientConfig.CABundle = certtest.PEM(earlierContainer, peer, gone, untagged, foreign)
			if _, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Update(ctx, v, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			now := time.Now()
			inj := &CABundleInjector{Client: cs, ValidatingName: testValidatingName, Bundle: func() []byte { return certtest.PEM(ours) },
				Replica: "ctl-a", Replicas: tc.replicas, now: func() time.Time { return now }}
			for _, step := range []struct {
				name string
				want []*x509.Certificate
			}{{"first sync", tc.wantNow}, {"after the grace", tc.wantLater}} {
				if err := inj.Sync(ctx); err != nil {
					t.Fatal(err)
				}
				got, err := parseCerts(bundles(t, cs)[1])
				if err != nil {
					t.Fatal(err)
				}
				if !sameCerts(got, step.want) {
					t.Errorf("%s: bundle holds %s, want %s", step.name, subjects(got), subjects(step.want))
				}
				now = now.Add(orphanGrace)
			}
		})
	}
}

func listed(names ...string) func(context.Context) (sets.Set[string], error) {
	return func(context.Context) (sets.Set[string], error) { return sets.New(names...), nil }
}

func sameCerts(a, b []*x509.Certificate) bool {
	if len(a) != len(b) {
		return false
	}
	for _, c := range a {
		if !slices.ContainsFunc(b, c.Equal) {
			return false
		}
	}
	return true
}

func subjects(certs []*x509.Certificate) []string {
	out := make([]string, 0, len(certs))
	for _, c := range certs {
		out = append(out, fmt.Sprintf("%s/%v", c.Subject.CommonName, c.Subject.OrganizationalUnit))
	}
	return out
}

func TestServiceReplicas(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	slice := func(name, service string, pods ...string) *discoveryv1.EndpointSlice {
		s := &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "prism", Labels: map[string]string{discoveryv1.LabelServiceName: service}}}
		for _, p := range pods {
			s.Endpoints = append(s.Endpoints, discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: p}})
		}
		return s
	}
	cs := fake.NewClientset(slice("ctl-ipv4", "prism-controller", "ctl-a", "ctl-b"), slice("ctl-ipv6", "prism-controller", "ctl-a"), slice("other", "metrics", "m-0"))
	got, err := ServiceReplicas(cs, "prism", "prism-controller")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := sets.New("ctl-a", "ctl-b"); !got.Equal(want) {
		t.Errorf("replicas %v, want %v", sets.List(got), sets.List(want))
	}
}

// fakePathToken hands out its token and records what it was shown.
type fakePathToken struct {
	token string
	found []string
}

func (f *fakePathToken) Split(path string) (string, string) {
	if i := strings.LastIndexByte(path, '/'); i >= 0 && strings.HasPrefix(path[i+1:], "tok-") {
		return path[:i], path[i+1:]
	}
	return path, ""
}

// Adopt keeps the smaller token, as webhook.PathToken does.
func (f *fakePathToken) Adopt(found string) string {
	f.found = append(f.found, found)
	if found != "" && found < f.token {
		f.token = found
	}
	return f.token
}

// The injector keeps every webhook's path ending in the token, in the
// service and the URL form alike, adopts the token it finds, and writes
// nothing once the paths carry it.
func TestCABundleInjectorKeepsThePathToken(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	s := newTestCerts(t, "")
	svc := func(path string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "prism", Name: "prism-controller", Path: &path}}
	}
	url := func(u string) admissionregistrationv1.WebhookClientConfig {
		return admissionregistrationv1.WebhookClientConfig{URL: &u}
	}
	cs := fake.NewClientset(
		&admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: testMutatingName},
			Webhooks: []admissionregistrationv1.MutatingWebhook{
				{Name: "rewrite.prism.dev", ClientConfig: svc("/rewrite-resourceclaims")},
				{Name: "pods.prism.dev", ClientConfig: url("https://127.0.0.1:8443/mutate-pods")},
			},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: testValidatingName},
			Webhooks: []admissionregistrationv1.ValidatingWebhook{
				{Name: "claims.prism.dev", ClientConfig: svc("/validate/tok-a")},
				{Name: "profiles.prism.dev", ClientConfig: url("https://127.0.0.1:8443/validate?x=1")},
			},
		},
	)
	tok := &fakePathToken{token: "tok-b"}
	inj := &CABundleInjector{Client: cs, MutatingName: testMutatingName, ValidatingName: testValidatingName, Bundle: s.CABundle, PathToken: tok}
	if err := inj.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	paths := func() []string {
		m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, testMutatingName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, testValidatingName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return []string{*m.Webhooks[0].ClientConfig.Service.Path, *m.Webhooks[1].ClientConfig.URL, *v.Webhooks[0].ClientConfig.Service.Path, *v.Webhooks[1].ClientConfig.URL}
	}
	// The mutating configuration had no token: the injector's own is
	// written. The validating one had a smaller one: it is adopted there,
	// and written to the mutating one at the next sync.
	want := []string{"/rewrite-resourceclaims/tok-b", "https://127.0.0.1:8443/mutate-pods/tok-b", "/validate/tok-a", "https://127.0.0.1:8443/validate/tok-a?x=1"}
	if diff := cmp.Diff(want, paths()); diff != "" {
		t.Errorf("paths (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"", "tok-a"}, tok.found); diff != "" {
		t.Errorf("tokens found (-want +got):\n%s", diff)
	}

	before := updates(cs)
	if err := inj.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := updates(cs) - before; n != 1 {
		t.Errorf("%d updates to bring the mutating configuration to the adopted token, want 1", n)
	}
	before = updates(cs)
	if err := inj.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := updates(cs) - before; n != 0 {
		t.Errorf("%d updates with every path carrying the token", n)
	}
}
