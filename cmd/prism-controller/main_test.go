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

// TestCapacityFormsFlags: the capacity forms are the default, and a form
// is cel or capacity.
func TestCapacityFormsFlags(t *testing.T) {
	for _, tc := range []struct {
		args        []string
		memoryFloor rewrite.Form
		wantErr     string
	}{
		{nil, "capacity", ""},
		{[]string{"--memory-floor=cel"}, "cel", ""},
		{[]string{"--memory-floor=capacity"}, "capacity", ""},
		{[]string{"--memory-floor=fast"}, "", `unknown form "fast"`},
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
		if o.memoryFloor != tc.memoryFloor {
			t.Errorf("%q: --memory-floor=%s, want %s", tc.args, o.memoryFloor, tc.memoryFloor)
		}
		if err := o.validate(); err != nil {
			t.Errorf("%q: %v", tc.args, err)
		}
	}
}

// TestCapacityFormsStayCELWhereTheyCannotPay: the tier bounds go with the
// memory floor; a CEL floor, and a floor with no namespace to probe in,
// keep both CEL; shares are offered wherever the probe can ask, whatever
// the floor's form.
func TestCapacityFormsStayCELWhereTheyCannotPay(t *testing.T) {
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
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			shares, forms := capacityForms(ctx, tc.o, fake.NewClientset())
			if (shares != nil) != tc.wantShares || (forms != nil) != tc.wantForms {
				t.Errorf("shares probed %v, capacity forms probed %v; want %v and %v",
					shares != nil, forms != nil, tc.wantShares, tc.wantForms)
			}
		})
	}
}
