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
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
)

func newTestCerts(t *testing.T, dir string) *SelfSignedCerts {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	s, err := NewSelfSignedCerts(ctx, CertOptions{
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
			ObjectMeta: metav1.ObjectMeta{Name: MutatingConfigName},
			Webhooks:   []admissionregistrationv1.MutatingWebhook{{Name: "rewrite.prism.dev", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: svc}}},
		},
		&admissionregistrationv1.ValidatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{Name: ValidatingConfigName},
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
	m, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, MutatingConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	v, err := cs.AdmissionregistrationV1().ValidatingWebhookConfigurations().Get(ctx, ValidatingConfigName, metav1.GetOptions{})
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
		inj := &CABundleInjector{Client: fake.NewClientset(), MutatingName: MutatingConfigName, ValidatingName: ValidatingConfigName, Bundle: s.CABundle}
		if err := inj.Sync(ctx); err == nil {
			t.Error("Sync succeeded without webhook configurations")
		}
	})

	cs := fake.NewClientset(webhookConfigs()...)
	inj := &CABundleInjector{Client: cs, MutatingName: MutatingConfigName, ValidatingName: ValidatingConfigName, Bundle: s.CABundle}
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
		m, _ := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, MutatingConfigName, metav1.GetOptions{})
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
		inj2 := &CABundleInjector{Client: cs, MutatingName: MutatingConfigName, ValidatingName: ValidatingConfigName, Bundle: other.CABundle}
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
