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

package features_test

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/prismgpu/prism/pkg/features"
	"github.com/prismgpu/prism/pkg/logging"
)

// Prism's gates share --feature-gates with the logging gates, as the
// binaries register them.
func TestGates(t *testing.T) {
	for _, tc := range []struct {
		name           string
		args           []string
		wantMIG        bool
		wantContextual bool
		wantErr        string
	}{
		{name: "off by default", args: nil, wantMIG: false, wantContextual: true},
		{name: "the flag turns it on", args: []string{"--feature-gates=MIGPartitions=true"}, wantMIG: true, wantContextual: true},
		{name: "beside a logging gate", args: []string{"--feature-gates=ContextualLogging=false,MIGPartitions=true"}, wantMIG: true, wantContextual: false},
		{name: "AllAlpha turns it on", args: []string{"--feature-gates=AllAlpha=true"}, wantMIG: true, wantContextual: true},
		{name: "not a boolean", args: []string{"--feature-gates=MIGPartitions=yes"}, wantErr: "MIGPartitions"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := logging.NewOptions(features.AddFeatureGates)
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			o.AddFlags(fs)
			err := fs.Parse(tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := o.FeatureGate().Enabled(features.MIGPartitions); got != tc.wantMIG {
				t.Errorf("MIGPartitions enabled = %t, want %t", got, tc.wantMIG)
			}
			if got := o.FeatureGate().Enabled(logsapi.ContextualLogging); got != tc.wantContextual {
				t.Errorf("ContextualLogging enabled = %t, want %t", got, tc.wantContextual)
			}
		})
	}
}

// --help lists the gate with its stage and default, which is how an
// operator learns it exists.
func TestGateIsListedAlphaAndOff(t *testing.T) {
	o := logging.NewOptions(features.AddFeatureGates)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	o.AddFlags(fs)
	help := fs.Lookup("feature-gates").Usage
	if want := "MIGPartitions=true|false (ALPHA - default=false)"; !strings.Contains(help, want) {
		t.Errorf("--feature-gates help does not list %q:\n%s", want, help)
	}
	if spec := o.FeatureGate().(featuregate.MutableVersionedFeatureGate).GetAll()[features.MIGPartitions]; spec.PreRelease != featuregate.Alpha || spec.Default {
		t.Errorf("MIGPartitions spec = %+v, want Alpha and off", spec)
	}
}
