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
	"fmt"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"

	"github.com/prismgpu/prism/internal/envflag"
	"github.com/prismgpu/prism/internal/envflag/envflagtest"
	"github.com/prismgpu/prism/internal/logging"
	"github.com/prismgpu/prism/internal/plugin/features"
)

// gates are Prism's and the logging gates behind one --feature-gates flag,
// as the binaries register them.
type gates struct {
	logging *logging.Options
}

func newFlags(g *gates) *pflag.FlagSet {
	g.logging = logging.NewOptions(features.AddFeatureGates)
	fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
	g.logging.AddFlags(fs)
	envflag.Bind(fs, "PRISM_", nil)
	return fs
}

func (g gates) enabled(mig, contextual bool) bool {
	return g.logging.FeatureGate().Enabled(features.MIGPartitions) == mig &&
		g.logging.FeatureGate().Enabled(logsapi.ContextualLogging) == contextual
}

// String is what a failed case shows.
func (g gates) String() string {
	return fmt.Sprintf("MIGPartitions=%t ContextualLogging=%t",
		g.logging.FeatureGate().Enabled(features.MIGPartitions), g.logging.FeatureGate().Enabled(logsapi.ContextualLogging))
}

// Prism's gates share --feature-gates with the logging gates, as the
// binaries register them, and the chart sets them through the flag's
// variable.
func TestGates(t *testing.T) {
	want := func(mig, contextual bool) func(gates) bool {
		return func(g gates) bool { return g.enabled(mig, contextual) }
	}
	envflagtest.Run(t, newFlags, []envflagtest.Case[gates]{
		{Name: "off by default", Check: want(false, true)},
		{Name: "the flag turns it on", Args: []string{"--feature-gates=MIGPartitions=true"}, Check: want(true, true)},
		{Name: "the variable turns it on", Env: map[string]string{"PRISM_FEATURE_GATES": "MIGPartitions=true"}, Check: want(true, true)},
		{Name: "beside a logging gate", Args: []string{"--feature-gates=ContextualLogging=false,MIGPartitions=true"}, Check: want(true, false)},
		{Name: "AllAlpha turns it on", Args: []string{"--feature-gates=AllAlpha=true"}, Check: want(true, true)},
		{Name: "not a boolean", Args: []string{"--feature-gates=MIGPartitions=yes"}, WantErr: "MIGPartitions"},
	})
}

// --help lists the gate with its stage and default, which is how an
// operator learns it exists.
func TestGateIsListedAlphaAndOff(t *testing.T) {
	var g gates
	fs := newFlags(&g)
	help := fs.Lookup("feature-gates").Usage
	if want := "MIGPartitions=true|false (ALPHA - default=false)"; !strings.Contains(help, want) {
		t.Errorf("--feature-gates help does not list %q:\n%s", want, help)
	}
	if spec := g.logging.FeatureGate().(featuregate.MutableVersionedFeatureGate).GetAll()[features.MIGPartitions]; spec.PreRelease != featuregate.Alpha || spec.Default {
		t.Errorf("MIGPartitions spec = %+v, want Alpha and off", spec)
	}
}
