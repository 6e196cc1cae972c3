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
	"errors"
	"fmt"
	"os"
	"sync"

	"k8s.io/klog/v2"
)

// ServerTLS is the webhook server's TLS configuration. getCertificate is
// asked on every handshake, so rotated serving certificates are picked up
// without a restart. With clientCAs, a client must present a certificate
// that one of them signed: the handshake fails otherwise, before any
// request is read, so that only the API server (configured with such a
// certificate) can ask for a review. Without, anyone who reaches the port
// can.
func ServerTLS(getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error), clientCAs *ClientCAs) *tls.Config {
	base := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: getCertificate,
	}
	if clientCAs == nil {
		return base
	}
	base.ClientAuth = tls.RequireAndVerifyClientCert
	// No session resumption: a resumed session skips the certificate
	// check, so a CA taken out of the file would keep its clients until
	// their tickets expired. The API server keeps its connections open, so
	// full handshakes are rare.
	base.SessionTicketsDisabled = true
	cfg := base.Clone()
	cfg.ClientCAs = clientCAs.Pool()
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := base.Clone()
		c.ClientCAs = clientCAs.Pool()
		return c, nil
	}
	return cfg
}

// ClientCAs are the CAs of a PEM file that the webhooks' clients must
// present a certificate of. The file is checked on every TLS handshake
// (a stat) and read again when it changed, so a mounted ConfigMap that the
// kubelet updates takes effect at the next connection. A file that no
// longer parses leaves the CAs read before in force, and says so once.
type ClientCAs struct {
	path   string
	logger klog.Logger

	mu      sync.Mutex
	info    os.FileInfo // what pool was read from, or last failed to
	pool    *x509.CertPool
	lastErr string
}

// LoadClientCAs reads the CAs of path, which must hold at least one PEM
// certificate.
func LoadClientCAs(ctx context.Context, path string) (*ClientCAs, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	pool, err := readCAs(path)
	if err != nil {
		return nil, err
	}
	logger := klog.FromContext(ctx).WithValues("path", path)
	logger.Info("Webhook clients must present a certificate of these CAs")
	return &ClientCAs{path: path, logger: logger, info: info, pool: pool}, nil
}

// Pool returns the CAs, read again first if the file changed.
func (c *ClientCAs) Pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	info, err := os.Stat(c.path)
	if err != nil {
		c.fail(fmt.Errorf("client CA file: %w", err))
		return c.pool
	}
	if os.SameFile(info, c.info) && info.ModTime().Equal(c.info.ModTime()) && info.Size() == c.info.Size() {
		return c.pool
	}
	c.info = info
	pool, err := readCAs(c.path)
	if err != nil {
		c.fail(err)
		return c.pool
	}
	c.pool, c.lastErr = pool, ""
	c.logger.Info("Read the client CAs again")
	return c.pool
}

// fail logs err unless it was the last one logged.
func (c *ClientCAs) fail(err error) {
	if err.Error() == c.lastErr {
		return
	}
	c.lastErr = err.Error()
	c.logger.Error(err, "Keeping the client CAs read before")
}

func readCAs(path string) (*x509.CertPool, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("client CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(data) {
		return nil, errors.New("client CA file " + path + " holds no PEM certificate")
	}
	return pool, nil
}
