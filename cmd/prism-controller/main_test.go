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
	"strings"
	"testing"

	"github.com/prismgpu/prism/pkg/rewrite"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/pkg/envflag"
)

// A flag without a variable cannot be set through the chart's extraEnv,
// and a renamed variable silently stops configuring what it did.
func TestEveryFlagHasAnEnvMirror(t *testing.T) {
	want := map[string]string{
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
		"kubeconfig":     "KUBECONFIG",
		"logging-format": "PRISM_LOGGING_FORMAT",
		"v":              "PRISM_VERBOSITY",
		"vmodule":        "PRISM_VMODULE",
		"feature-gates":  "PRISM_FEATURE_GATES",
	}
	// A stray variable must not turn start-up into printing the version.
	if err := envflag.Check(newFlags(&options{}), want, "version"); err != nil {
		t.Error(err)
	}
}

func TestEnvironment(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(options) bool
		wantErr string
	}{{
		name: "every setting can come from the environment",
		env: map[string]string{"PRISM_WEBHOOK_PORT": "8443", "PRISM_SELF_SIGNED": "false", "POD_NAMESPACE": "gpu-system",
			"PRISM_EXTRA_SANS": "127.0.0.1,prism.local"},
		check: func(o options) bool {
			return o.webhookPort == 8443 && !o.selfSigned && o.namespace == "gpu-system" &&
				strings.Join(o.extraSANs, ",") == "127.0.0.1,prism.local"
		},
	}, {
		name:  "the command line wins over the environment",
		args:  []string{"--namespace=prism-system", "-v=2"},
		env:   map[string]string{"POD_NAMESPACE": "other", "PRISM_VERBOSITY": "4"},
		check: func(o options) bool { return o.namespace == "prism-system" },
	}, {
		name:    "a port that does not parse",
		env:     map[string]string{"PRISM_WEBHOOK_PORT": "https"},
		wantErr: `environment variable PRISM_WEBHOOK_PORT="https" is not a valid value for --webhook-port`,
	}, {
		name:    "a bool that does not parse",
		env:     map[string]string{"PRISM_AUTO_PROFILE": "off"},
		wantErr: `environment variable PRISM_AUTO_PROFILE="off" is not a valid value for --auto-profile`,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var o options
			err := envflag.Parse(newFlags(&o), tc.args, func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok })
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %s", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !tc.check(o) {
				t.Errorf("options = %+v", o)
			}
		})
	}
}

// TestCapacityFormsFlags: the capacity forms are the default, a form is
// cel or capacity, and tier bounds without the capacity floor are not an
// error (capacityForms keeps them CEL and says so).
func TestCapacityFormsFlags(t *testing.T) {
	for _, tc := range []struct {
		args                    []string
		memoryFloor, tierBounds rewrite.Form
		wantErr                 string
	}{
		{nil, "capacity", "capacity", ""},
		{[]string{"--memory-floor=cel"}, "cel", "capacity", ""},
		{[]string{"--memory-floor=cel", "--tier-bounds=cel"}, "cel", "cel", ""},
		{[]string{"--tier-bounds=fast"}, "", "", `unknown form "fast"`},
	} {
		var o options
		err := envflag.Parse(newFlags(&o), append([]string{"--namespace=prism-system"}, tc.args...), func(string) (string, bool) { return "", false })
		if tc.memoryFloor == "" {
			// A form is typed from the flag on: a wrong one fails parsing.
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: parse error %v, want one containing %s", tc.args, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if o.memoryFloor != tc.memoryFloor || o.tierBounds != tc.tierBounds {
			t.Errorf("%q: --memory-floor=%s --tier-bounds=%s, want %s and %s", tc.args, o.memoryFloor, o.tierBounds, tc.memoryFloor, tc.tierBounds)
		}
		err = o.validate()
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tc.args, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("%q: error %v, want one containing %s", tc.args, err, tc.wantErr)
		}
	}
}

// TestCapacityFormsStayCELWhereTheyCannotPay: bounds without the capacity
// floor, and a floor with no namespace to probe in, stay CEL; shares are
// offered wherever the probe can ask, whatever the floor's form.
func TestCapacityFormsStayCELWhereTheyCannotPay(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name                                    string
		o                                       options
		wantShares, wantMemoryFloor, wantBounds bool
	}{
		{"both capacity", options{memoryFloor: "capacity", tierBounds: "capacity", namespace: "prism"}, true, true, true},
		{"floor only", options{memoryFloor: "capacity", tierBounds: "cel", namespace: "prism"}, true, true, false},
		{"bounds without the floor", options{memoryFloor: "cel", tierBounds: "capacity", namespace: "prism"}, true, false, false},
		{"CEL floor", options{memoryFloor: "cel", tierBounds: "cel", namespace: "prism"}, true, false, false},
		{"no namespace to probe in", options{memoryFloor: "capacity", tierBounds: "capacity"}, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			shares, floor, bounds := capacityForms(ctx, tc.o, fake.NewClientset())
			if (shares != nil) != tc.wantShares || (floor != nil) != tc.wantMemoryFloor || (bounds != nil) != tc.wantBounds {
				t.Errorf("shares probed %v, memory floor probed %v, tier bounds probed %v; want %v, %v and %v",
					shares != nil, floor != nil, bounds != nil, tc.wantShares, tc.wantMemoryFloor, tc.wantBounds)
			}
		})
	}
}
