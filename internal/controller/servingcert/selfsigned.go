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
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/atomicfile"
)

// File names in the certificate directory. They are the keys of a
// kubernetes.io/tls Secret, so cert-manager's Secret can be mounted there.
const (
	CertFile = "tls.crt"
	KeyFile  = "tls.key"
	CAFile   = "ca.crt"
)

// Options configure NewSelfSigned.
type Options struct {
	// Dir receives tls.crt, tls.key and ca.crt. Empty: not written.
	Dir string
	// ServiceName and Namespace give the DNS names the API server uses.
	ServiceName, Namespace string
	// ExtraSANs are more DNS names or IP addresses for the serving cert.
	ExtraSANs []string
	// CAValidity defaults to one year, CertValidity to 30 days. Both are
	// re-issued after RotateAfter (80 %) of their life, so a leaked key is
	// useful for weeks, not years.
	CAValidity, CertValidity time.Duration
	// Replica names this replica (its pod name). It is written into the
	// CA's subject so that CABundleInjector can tell whose CA is whose and
	// drop those of replicas that are gone.
	Replica string
}

// RotateAfter is the fraction of a certificate's lifetime after which it is
// re-issued; the rest is the margin for a controller that was down.
const RotateAfter = 0.8

// SelfSigned issues and rotates a private CA and a serving certificate
// for the webhook service. It is meant for clusters without cert-manager.
type SelfSigned struct {
	opts Options
	now  func() time.Time

	mu     sync.Mutex
	ca     *issuer
	oldCAs []*x509.Certificate // still trusted until they expire
	leaf   *x509.Certificate

	cert atomic.Pointer[tls.Certificate]
}

type issuer struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// NewSelfSigned creates a CA and a serving certificate and writes them
// to opts.Dir.
func NewSelfSigned(ctx context.Context, opts Options) (*SelfSigned, error) {
	if opts.ServiceName == "" || opts.Namespace == "" {
		return nil, errors.New("self-signed certificates need a service name and namespace")
	}
	if opts.CAValidity == 0 {
		opts.CAValidity = 365 * 24 * time.Hour
	}
	if opts.CertValidity == 0 {
		opts.CertValidity = 30 * 24 * time.Hour
	}
	if opts.CertValidity > opts.CAValidity {
		return nil, fmt.Errorf("certificate validity %s exceeds CA validity %s", opts.CertValidity, opts.CAValidity)
	}
	s := &SelfSigned{opts: opts, now: time.Now}
	if err := s.rotateCA(); err != nil {
		return nil, err
	}
	if err := s.rotateCert(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// GetCertificate is for tls.Config.GetCertificate.
func (s *SelfSigned) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert.Load(), nil
}

// CABundle returns the PEM certificates clients must trust: the current CA
// and earlier ones that have not expired, newest first.
func (s *SelfSigned) CABundle() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	var buf bytes.Buffer
	_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: s.ca.cert.Raw})
	now := s.now()
	for _, c := range s.oldCAs {
		if now.Before(c.NotAfter) {
			_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
		}
	}
	return buf.Bytes()
}

// Run re-issues certificates at RotateAfter of their lifetime until ctx is
// done. publish must make the API server trust CABundle; it is called, and
// must have succeeded, before a certificate from a new CA is served, so
// there is no window in which the API server rejects the webhook.
func (s *SelfSigned) Run(ctx context.Context, publish func(context.Context) error) {
	logger := klog.FromContext(ctx)
	for {
		wait := s.nextRotation().Sub(s.now())
		logger.V(2).Info("Next certificate rotation", "in", wait)
		select {
		case <-ctx.Done():
			return
		case <-time.After(max(wait, time.Second)):
		}
		if err := s.rotate(ctx, publish); err != nil {
			logger.Error(err, "Rotating webhook certificates, retrying")
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Minute):
			}
		}
	}
}

func (s *SelfSigned) rotate(ctx context.Context, publish func(context.Context) error) error {
	if s.due(s.currentCA()) {
		if err := s.rotateCA(); err != nil {
			return err
		}
		if err := publish(ctx); err != nil {
			return fmt.Errorf("publishing new CA: %w", err)
		}
	}
	return s.rotateCert(ctx)
}

func (s *SelfSigned) currentCA() *x509.Certificate {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ca.cert
}

func (s *SelfSigned) nextRotation() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return earliest(rotationTime(s.ca.cert), rotationTime(s.leaf))
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (s *SelfSigned) due(c *x509.Certificate) bool {
	return !s.now().Before(rotationTime(c))
}

func rotationTime(c *x509.Certificate) time.Time {
	life := c.NotAfter.Sub(c.NotBefore)
	return c.NotBefore.Add(time.Duration(float64(life) * RotateAfter))
}

func (s *SelfSigned) rotateCA() error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating CA key: %w", err)
	}
	now := s.now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               caSubject(s.opts.Replica, now),
		NotBefore:             now.Add(-time.Hour), // clock skew between nodes
		NotAfter:              now.Add(s.opts.CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return fmt.Errorf("creating CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parsing CA certificate: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ca != nil {
		s.oldCAs = append([]*x509.Certificate{s.ca.cert}, s.oldCAs...)
	}
	s.ca = &issuer{cert: cert, key: key}
	return nil
}

// caCommonNamePrefix starts the common name of every CA this package makes.
const caCommonNamePrefix = "prism-webhook-ca@"

// caSubject names a CA after its replica, in the organizational unit.
func caSubject(replica string, now time.Time) pkix.Name {
	name := pkix.Name{CommonName: caCommonNamePrefix + now.UTC().Format(time.RFC3339)}
	if replica != "" {
		name.OrganizationalUnit = []string{replica}
	}
	return name
}

// caReplica returns the replica a Prism CA belongs to, "" for one made
// before CAs carried it; ok is false for a CA this package did not make.
func caReplica(c *x509.Certificate) (replica string, ok bool) {
	if !strings.HasPrefix(c.Subject.CommonName, caCommonNamePrefix) {
		return "", false
	}
	if len(c.Subject.OrganizationalUnit) == 1 {
		return c.Subject.OrganizationalUnit[0], true
	}
	return "", true
}

func (s *SelfSigned) rotateCert(ctx context.Context) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generating serving key: %w", err)
	}
	svc := s.opts.ServiceName + "." + s.opts.Namespace + ".svc"
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: svc},
		DNSNames:     []string{s.opts.ServiceName, s.opts.ServiceName + "." + s.opts.Namespace, svc, svc + ".cluster.local"},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, san := range s.opts.ExtraSANs {
		if ip := net.ParseIP(san); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if san != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, san)
		}
	}

	s.mu.Lock()
	ca := s.ca
	s.mu.Unlock()
	now := s.now()
	tmpl.NotBefore = now.Add(-time.Hour)
	// A serving cert outliving its CA would be rejected in its last days.
	tmpl.NotAfter = earliest(now.Add(s.opts.CertValidity), ca.cert.NotAfter)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return fmt.Errorf("creating serving certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return fmt.Errorf("parsing serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encoding serving key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("loading serving key pair: %w", err)
	}
	pair.Leaf = leaf
	if err := s.write(certPEM, keyPEM, ca.cert); err != nil {
		return err
	}
	s.mu.Lock()
	s.leaf = leaf
	s.mu.Unlock()
	s.cert.Store(&pair)
	klog.FromContext(ctx).Info("Issued webhook serving certificate", "dnsNames", leaf.DNSNames, "ips", leaf.IPAddresses, "notAfter", leaf.NotAfter)
	return nil
}

// write stores the files for anything else that needs them (a sidecar, a
// debugging user). The key is written before the certificate so that a
// reader never finds a certificate without its key.
func (s *SelfSigned) write(certPEM, keyPEM []byte, ca *x509.Certificate) error {
	if s.opts.Dir == "" {
		return nil
	}
	if err := os.MkdirAll(s.opts.Dir, 0o700); err != nil {
		return fmt.Errorf("creating certificate directory: %w", err)
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Raw})
	for _, f := range []struct {
		name string
		data []byte
		mode os.FileMode
	}{{KeyFile, keyPEM, 0o600}, {CertFile, certPEM, 0o644}, {CAFile, caPEM, 0o644}} {
		path := filepath.Join(s.opts.Dir, f.name)
		if err := atomicfile.WriteFile(path, f.data, f.mode); err != nil {
			return fmt.Errorf("writing %s: %w", path, err)
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		// crypto/rand does not fail on supported platforms.
		panic(err)
	}
	return n
}
