//go:build !simulation

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

	"github.com/spf13/pflag"

	"github.com/prismgpu/prism/internal/plugin/cdi"
)

// simulationOptions are empty in a release build: simulated GPUs and
// injected faults are test builds' (simulation.go).
type simulationOptions struct{}

func (*simulationOptions) addFlags(*pflag.FlagSet) {}

// testBuildVariables are the test build's --fleet and --simulated-faults.
// The chart sets the first for simulation.fleet; a release binary that
// ignored it would go looking for NVML and fail with advice for a GPU node.
var testBuildVariables = []string{"PRISM_FLEET", "PRISM_SIMULATED_FAULTS"}

func (simulationOptions) validate(lookup func(string) (string, bool)) error {
	for _, name := range testBuildVariables {
		if v, ok := lookup(name); ok && v != "" {
			return fmt.Errorf("%s is set, but this is a release build, which reads GPUs only through NVML: simulated GPUs need a test build of the plugin (go build -tags simulation; images: docs/testing.md)", name)
		}
	}
	return nil
}

func simulatedGPUs(context.Context, options, cdi.Roots) (*gpus, error) {
	return nil, nil
}
