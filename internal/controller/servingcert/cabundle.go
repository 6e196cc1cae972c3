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
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
)

// maxBundleCerts bounds the caBundle. Each controller replica in
// self-signed mode brings its own CA; they are merged rather than replaced
// so that replicas do not take turns locking each other out. CAs of
// replicas that are gone are pruned (see CABundleInjector.Replicas); the
// bound is for when that cannot be known.
const maxBundleCerts = 8

// orphanGrace is how long a CA whose replica is not listed stays trusted.
// A replica that has just started may not be in the Service's
// EndpointSlices yet; one that is terminating still is.
const orphanGrace = 5 * time.Minute

// CABundleInjector keeps the caBundle of the webhook configurations
// trusting Bundle, and their paths carrying PathToken's token. Someone resetting it (a Helm upgrade, kubectl apply) is
// undone within Interval.
type CABundleInjector struct {
	Client                       kubernetes.Interface
	MutatingName, ValidatingName string
	// Bundle returns the PEM CA certificates that must be trusted.
	Bundle func() []byte
	// Interval between checks; defaults to 30s. Failures are retried
	// sooner, with backoff.
	Interval time.Duration
	// Replica is this replica's name, the Options.Replica its CAs
	// carry. A CA that carries it but is not in Bundle was made by an
	// earlier container of this pod, whose key is gone: it is dropped.
	Replica string
	// Replicas lists the replicas that exist now. CAs of other replicas
	// are dropped once orphanGrace has passed without their replica being
	// listed. Nil, or an error: only expired CAs are dropped.
	Replicas func(context.Context) (sets.Set[string], error)
	// PathToken, if set, keeps a token as the last segment of every
	// webhook's path (webhook.PathToken).
	PathToken PathToken

	now func() time.Time

	mu sync.Mutex
	// orphanSince is when each CA (by its DER) was first seen without a
	// listed replica.
	orphanSince map[string]time.Time
}

// PathToken is the token a webhook's path ends in.
type PathToken interface {
	// Split splits a path into the webhook's own path and the token
	// it ends in ("" for none).
	Split(path string) (base, token string)
	// Adopt is given the token found in a configuration ("" for none)
	// and returns the one to write.
	Adopt(found string) string
}

// Run calls Sync until ctx is done.
func (i *CABundleInjector) Run(ctx context.Context) {
	logger := klog.FromContext(ctx)
	interval := i.Interval
	if interval <= 0 {
		interval = 30 * time.Second
	}
	backoff := time.Second
	for {
		wait := interval
		if err := i.Sync(ctx); err != nil {
			logger.Error(err, "Updating webhook caBundle, retrying", "in", backoff)
			wait, backoff = backoff, min(2*backoff, interval)
		} else {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// Sync makes every webhook of both configurations trust Bundle. It fails
// while a configuration does not exist, which is normal during install.
func (i *CABundleInjector) Sync(ctx context.Context) error {
	ours, err := parseCerts(i.Bundle())
	if err != nil || len(ours) == 0 {
		return fmt.Errorf("own CA bundle unusable: %w", errors.Join(err, errors.New("no certificates")))
	}
	now := time.Now()
	if i.now != nil {
		now = i.now()
	}
	var live sets.Set[string]
	if i.Replicas != nil {
		if live, err = i.Replicas(ctx); err != nil {
			// The bundle stays bounded by expiry and maxBundleCerts.
			klog.FromContext(ctx).Error(err, "Listing controller replicas, not pruning their CAs")
			live = nil
		} else if i.Replica != "" && !live.Has(i.Replica) {
			// A list without this replica is wrong (a Service of another
			// name) or lagging; acting on it would drop live replicas' CAs.
			klog.FromContext(ctx).V(2).Info("This replica is not listed, not pruning CAs", "replica", i.Replica, "listed", sets.List(live))
			live = nil
		}
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	merge := func(existing []byte) []byte {
		return mergeBundle(existing, ours, now, func(c *x509.Certificate) bool { return i.stale(c, live, now) })
	}

	update := func(ccs []*admissionregistrationv1.WebhookClientConfig) bool {
		changed := false
		for _, cc := range ccs {
			changed = setBundle(cc, merge) || changed
		}
		if i.PathToken != nil {
			changed = setPathTokens(ccs, i.PathToken) || changed
		}
		return changed
	}

	var errs []error
	if i.MutatingName != "" {
		errs = append(errs, updateConfig(ctx, "MutatingWebhookConfiguration", i.MutatingName,
			i.Client.AdmissionregistrationV1().MutatingWebhookConfigurations(), mutatingClientConfigs, update))
	}
	if i.ValidatingName != "" {
		errs = append(errs, updateConfig(ctx, "ValidatingWebhookConfiguration", i.ValidatingName,
			i.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations(), validatingClientConfigs, update))
	}
	return errors.Join(errs...)
}

// setPathTokens makes the path of every client config end in the token
// that token returns for the first token found among them.
func setPathTokens(ccs []*admissionregistrationv1.WebhookClientConfig, token PathToken) bool {
	ccs = slices.DeleteFunc(slices.Clone(ccs), func(cc *admissionregistrationv1.WebhookClientConfig) bool { return cc.Service == nil && cc.URL == nil })
	found := ""
	for _, cc := range ccs {
		if _, t := token.Split(clientPath(cc)); t != "" {
			found = t
			break
		}
	}
	want := token.Adopt(found)
	changed := false
	for _, cc := range ccs {
		path := clientPath(cc)
		base, _ := token.Split(path)
		if p := base + "/" + want; p != path {
			setClientPath(cc, p)
			changed = true
		}
	}
	return changed
}

// clientPath is the path a client config sends reviews to.
func clientPath(cc *admissionregistrationv1.WebhookClientConfig) string {
	if cc.Service != nil {
		return ptr.Deref(cc.Service.Path, "")
	}
	if cc.URL != nil {
		if u, err := url.Parse(*cc.URL); err == nil {
			return u.Path
		}
	}
	return ""
}

func setClientPath(cc *admissionregistrationv1.WebhookClientConfig, path string) {
	if cc.Service != nil {
		cc.Service.Path = &path
		return
	}
	if cc.URL != nil {
		if u, err := url.Parse(*cc.URL); err == nil {
			u.Path = path
			cc.URL = ptr.To(u.String())
		}
	}
}

func setBundle(cc *admissionregistrationv1.WebhookClientConfig, merge func([]byte) []byte) bool {
	want := merge(cc.CABundle)
	if bytes.Equal(want, cc.CABundle) {
		return false
	}
	cc.CABundle = want
	return true
}

// stale tells whether another replica's CA can be dropped: it was made by
// an earlier container of this pod, or its replica has not been listed for
// orphanGrace. CAs not made by a Prism controller are left alone. i.mu is
// held.
func (i *CABundleInjector) stale(c *x509.Certificate, live sets.Set[string], now time.Time) bool {
	owner, ok := caReplica(c)
	switch {
	case !ok:
		return false
	case owner != "" && owner == i.Replica:
		return true
	case live == nil:
		return false
	case live.Has(owner):
		delete(i.orphanSince, string(c.Raw))
		return false
	}
	if i.orphanSince == nil {
		i.orphanSince = make(map[string]time.Time)
	}
	since, seen := i.orphanSince[string(c.Raw)]
	if !seen {
		i.orphanSince[string(c.Raw)] = now
		return false
	}
	return now.Sub(since) >= orphanGrace
}

// mergeBundle returns ours plus the unexpired certificates of existing
// that are not stale, at most maxBundleCerts, newest first. The order
// depends only on the set, so replicas computing it agree and stop
// updating.
func mergeBundle(existing []byte, ours []*x509.Certificate, now time.Time, stale func(*x509.Certificate) bool) []byte {
	theirs, _ := parseCerts(existing) // unparsable blocks are dropped
	keep := slices.Clone(ours)
	seen := func(c *x509.Certificate) bool {
		return slices.ContainsFunc(keep, func(k *x509.Certificate) bool { return k.Equal(c) })
	}
	sortNewestFirst(theirs)
	for _, c := range theirs {
		if len(keep) >= maxBundleCerts {
			break
		}
		if now.Before(c.NotAfter) && !seen(c) && !stale(c) {
			keep = append(keep, c)
		}
	}
	sortNewestFirst(keep)
	var buf bytes.Buffer
	for _, c := range keep {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return buf.Bytes()
}

func sortNewestFirst(certs []*x509.Certificate) {
	slices.SortStableFunc(certs, func(a, b *x509.Certificate) int {
		if c := b.NotBefore.Compare(a.NotBefore); c != 0 {
			return c
		}
		return bytes.Compare(a.Raw, b.Raw)
	})
}

func parseCerts(data []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	var errs []error
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		out = append(out, c)
	}
	return out, errors.Join(errs...)
}

// configClient is the client of one kind of webhook configuration.
type configClient[C any] interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (C, error)
	Update(ctx context.Context, cfg C, opts metav1.UpdateOptions) (C, error)
}

func mutatingClientConfigs(c *admissionregistrationv1.MutatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
	return clientConfigsOf(c.Webhooks, func(w *admissionregistrationv1.MutatingWebhook) *admissionregistrationv1.WebhookClientConfig {
		return &w.ClientConfig
	})
}

func validatingClientConfigs(c *admissionregistrationv1.ValidatingWebhookConfiguration) []*admissionregistrationv1.WebhookClientConfig {
	return clientConfigsOf(c.Webhooks, func(w *admissionregistrationv1.ValidatingWebhook) *admissionregistrationv1.WebhookClientConfig {
		return &w.ClientConfig
	})
}

// clientConfigsOf points at the client config of each webhook.
func clientConfigsOf[W any](webhooks []W, clientConfig func(*W) *admissionregistrationv1.WebhookClientConfig) []*admissionregistrationv1.WebhookClientConfig {
	out := make([]*admissionregistrationv1.WebhookClientConfig, len(webhooks))
	for j := range webhooks {
		out[j] = clientConfig(&webhooks[j])
	}
	return out
}

// updateConfig applies update to the client configs of every webhook of
// one configuration, the mutating and the validating kind alike, and
// writes the configuration if update changed one, retrying on conflicts.
func updateConfig[C any](ctx context.Context, kind, name string, api configClient[C],
	clientConfigs func(C) []*admissionregistrationv1.WebhookClientConfig,
	update func([]*admissionregistrationv1.WebhookClientConfig) bool) error {
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cfg, err := api.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("getting %s %s: %w", kind, name, err)
		}
		if !update(clientConfigs(cfg)) {
			return nil
		}
		if _, err := api.Update(ctx, cfg, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("updating %s %s: %w", kind, name, err)
		}
		klog.FromContext(ctx).Info("Updated the webhooks' caBundle and paths", "kind", kind, "name", name)
		return nil
	})
}
