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

// Package logging configures klog the way Kubernetes components do, through
// component-base: --logging-format (text or json), -v, --vmodule, and
// --feature-gates for contextual logging and the logging option gates.
package logging

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/component-base/featuregate"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"

	// Registers the json format; without it --logging-format offers text only.
	_ "k8s.io/component-base/logs/json/register"

	"github.com/prismgpu/prism/internal/version"
)

// Options are the logging flags of one binary.
type Options struct {
	config *logsapi.LoggingConfiguration
	gates  featuregate.MutableVersionedFeatureGate
}

// NewOptions returns the defaults: text format, verbosity 0, contextual
// logging on (its gate is beta and on by default). Each of add registers
// more gates (such as features.AddFeatureGates), so that one --feature-gates
// flag sets the logging gates and the binary's own.
func NewOptions(add ...func(featuregate.MutableVersionedFeatureGate) error) *Options {
	gates := featuregate.NewFeatureGate()
	// Fails only when a gate is registered twice: a programming error.
	for _, register := range append([]func(featuregate.MutableVersionedFeatureGate) error{logsapi.AddFeatureGates}, add...) {
		if err := register(gates); err != nil {
			panic(fmt.Sprintf("register feature gates: %v", err))
		}
	}
	return &Options{config: logsapi.NewLoggingConfiguration(), gates: gates}
}

// FeatureGate is what --feature-gates set, for reading once the flags are
// parsed.
func (o *Options) FeatureGate() featuregate.FeatureGate {
	return o.gates
}

// AddFlags adds the logging flags and --feature-gates to fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	logsapi.AddFlags(o.config, fs)
	o.gates.AddFlag(fs)
}

// Apply validates the parsed flags and installs the logger. Call it once,
// right after parsing, before anything logs.
func (o *Options) Apply() error {
	return o.apply(nil)
}

func (o *Options) apply(streams *logsapi.LoggingOptions) error {
	if err := logsapi.ValidateAndApplyWithOptions(o.config, streams, o.gates); err != nil {
		return fmt.Errorf("configure logging: %w", err)
	}
	return nil
}

// Run runs a binary's work, once Apply installed the logger, until SIGINT or
// SIGTERM cancels its context. The context carries a logger named after the
// binary, which first logs the build. An error is logged and exits 1, with
// no retry: the kubelet or the Deployment restarts the binary.
func Run(name string, run func(context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	logger := klog.LoggerWithName(klog.Background(), name)
	ctx = klog.NewContext(ctx, logger)
	// Both lines name the main that called Run as their source.
	mainLogger := logger.WithCallDepth(1)
	mainLogger.Info("Starting", version.Get().KeysAndValues()...)
	if err := run(ctx); err != nil {
		mainLogger.Error(err, "Exiting")
		klog.Flush()
		os.Exit(1)
	}
}
