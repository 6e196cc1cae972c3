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

package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/envflag/envflagtest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// A flag without a variable cannot be set through the chart's extraEnv,
// and a renamed variable silently stops configuring what it did.
func TestEveryFlagHasAnEnvMirror(t *testing.T) {
	envflagtest.Mirrors(t, newFlags, map[string]string{
		"webhook-port":   "PRISM_WEBHOOK_PORT",
		"cert-dir":       "PRISM_CERT_DIR",
		"client-ca-file": "PRISM_CLIENT_CA_FILE",
		"self-signed":    "PRISM_SELF_SIGNED",
		"namespace":      "POD_NAMESPACE",
		"replica-name":   "POD_NAME",
		"extra-sans":     "PRISM_EXTRA_SANS",
		"policy":         "PRISM_POLICY",
		"auto-profile":   "PRISM_AUTO_PROFILE",
		"http-address":   "PRISM_HTTP_ADDRESS",
	})
}

func TestEnvironment(t *testing.T) {
	envflagtest.Run(t, newFlags, []envflagtest.Case[options]{{
		Name: "every setting can come from the environment",
		Env: map[string]string{"PRISM_WEBHOOK_PORT": "8443", "PRISM_SELF_SIGNED": "false", "POD_NAMESPACE": "gpu-system",
			"PRISM_EXTRA_SANS": "127.0.0.1,prism.local"},
		Check: func(o options) bool {
			return o.webhookPort == 8443 && !o.selfSigned && o.namespace == "gpu-system" &&
				strings.Join(o.extraSANs, ",") == "127.0.0.1,prism.local"
		},
	}, {
		Name:  "the command line wins over the environment",
		Args:  []string{"--namespace=prism-system", "-v=2"},
		Env:   map[string]string{"POD_NAMESPACE": "other", "PRISM_VERBOSITY": "4"},
		Check: func(o options) bool { return o.namespace == "prism-system" },
	}, {
		Name:    "a port that does not parse",
		Env:     map[string]string{"PRISM_WEBHOOK_PORT": "https"},
		WantErr: `environment variable PRISM_WEBHOOK_PORT="https" is not a valid value for --webhook-port`,
	}, {
		Name:    "a bool that does not parse",
		Env:     map[string]string{"PRISM_AUTO_PROFILE": "off"},
		WantErr: `environment variable PRISM_AUTO_PROFILE="off" is not a valid value for --auto-profile`,
	}})
}

// TestCapacityFormsFlags: the capacity forms are the default, and a form
// is cel or capacity; a wrong one fails parsing, as the form is typed from
// the flag on.
func TestCapacityFormsFlags(t *testing.T) {
	form := func(want rewrite.Form) func(options) bool {
		return func(o options) bool { return o.memoryFloor == want && o.validate() == nil }
	}
	envflagtest.Run(t, newFlags, []envflagtest.Case[options]{
		{Name: "default", Args: []string{"--namespace=prism-system"}, Check: form("capacity")},
		{Name: "cel", Args: []string{"--namespace=prism-system", "--memory-floor=cel"}, Check: form("cel")},
		{Name: "capacity", Args: []string{"--namespace=prism-system", "--memory-floor=capacity"}, Check: form("capacity")},
		{Name: "unknown", Args: []string{"--namespace=prism-system", "--memory-floor=fast"}, WantErr: `unknown form "fast"`},
	})
}

// TestCapacityDecision: the tier bounds go with the memory floor; a CEL
// floor keeps both CEL; shares are offered wherever the probe finds that
// the API server keeps capacity requests, whatever the floor's form; with
// no namespace to probe in, neither.
func TestCapacityDecision(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name                  string
		o                     options
		wantShares, wantForms bool
	}{
		{"capacity floor", options{memoryFloor: "capacity", namespace: "prism"}, true, true},
		{"CEL floor", options{memoryFloor: "cel", namespace: "prism"}, true, false},
		{"no namespace to probe in", options{memoryFloor: "capacity"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			// The fake API server keeps what it is sent, capacity requests
			// included.
			decision := capacityDecision(ctx, tc.o, fake.NewClientset())
			var got rewrite.Capacity
			err := wait.PollUntilContextCancel(ctx, 10*time.Millisecond, true, func(context.Context) (bool, error) {
				got = decision()
				return got.Shares || tc.o.namespace == "", nil
			})
			if err != nil {
				t.Fatalf("no decision: %v (%+v)", err, got)
			}
			if got.Shares != tc.wantShares || got.MemoryFloor != tc.wantForms || got.TierBounds != tc.wantForms || got.Why == "" {
				t.Errorf("decision %+v; want shares %v, capacity forms %v, and why", got, tc.wantShares, tc.wantForms)
			}
		})
	}
}

// TestReadiness: /readyz is ready once the parts every review reads have
// synced, whatever the others; ?verbose says which are still syncing.
func TestReadiness(t *testing.T) {
	for _, tc := range []struct {
		name     string
		synced   []string
		query    string
		wantCode int
		wantBody string
	}{
		{name: "the fleet not yet read", synced: []string{"claims"}, wantCode: http.StatusServiceUnavailable,
			wantBody: "profiles and slices: syncing\nclaims: synced (not needed to serve: reviews that read it wait for it)\nnot ready\n"},
		{name: "the fleet read, the claims not", synced: []string{"profiles and slices"}, wantCode: http.StatusOK, wantBody: "ok"},
		{name: "verbose", synced: []string{"profiles and slices"}, query: "?verbose", wantCode: http.StatusOK,
			wantBody: "profiles and slices: synced\nclaims: syncing (not needed to serve: reviews that read it wait for it)\nok\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parts := map[string]*webhook.Synced{"profiles and slices": webhook.NewSynced("profiles and slices", nil), "claims": webhook.NewSynced("claims", nil)}
			for _, name := range tc.synced {
				parts[name].MarkSynced()
			}
			rec := httptest.NewRecorder()
			readiness{needed: []*webhook.Synced{parts["profiles and slices"]}, later: []*webhook.Synced{parts["claims"]}}.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz"+tc.query, nil))
			if diff := cmp.Diff(fmt.Sprintf("%d %s", tc.wantCode, tc.wantBody), fmt.Sprintf("%d %s", rec.Code, rec.Body)); diff != "" {
				t.Errorf("/readyz%s (-want +got):\n%s", tc.query, diff)
			}
		})
	}
}
