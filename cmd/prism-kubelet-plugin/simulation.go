//go:build simulation

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
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// A test build (go build -tags simulation) runs a node without GPUs: --fleet
// serves a fleet file's GPUs through go-nvml's mock, and --simulated-faults
// raises Xids appended to a file. The demo, the bench, the soak, the e2e
// tests and the images they install are test builds; the release binary and
// images have neither flag (simulation_default.go).

// simulationOptions are the test build's flags.
type simulationOptions struct {
	fleet, faults string
}

func (s *simulationOptions) addFlags(flags *pflag.FlagSet) {
	flags.StringVar(&s.fleet, "fleet", "", "Test builds only: simulate this node's GPUs from a fleet file instead of NVML; a fake driver root is made under --state-dir unless --driver-root is set.")
	flags.StringVar(&s.faults, "simulated-faults", "", "Test builds only, with --fleet: a file of JSON lines like {\"gpu\":0,\"xid\":48} whose appended lines are raised as NVML events; \"gpuInstance\":N names a MIG GPU instance.")
}

func (s simulationOptions) validate(func(string) (string, bool)) error {
	if s.faults != "" && s.fleet == "" {
		return errors.New("--simulated-faults needs --fleet: only simulated GPUs take injected faults")
	}
	return nil
}

// simulatedGPUs are the GPUs of --fleet, or nil without it.
func simulatedGPUs(ctx context.Context, o options, roots cdi.Roots) (*gpus, error) {
	if o.simulation.fleet == "" {
		return nil, nil
	}
	fleet, err := nvml.LoadFleet(o.simulation.fleet)
	if err != nil {
		return nil, err
	}
	sim, err := nvml.NewSimulated(fleet, o.nodeName)
	if err != nil {
		return nil, err
	}
	lib, faults := nvml.SimulateFaults(sim)
	if o.simulation.faults != "" {
		go faults.FollowFile(ctx, o.simulation.faults)
	}
	if o.driverRoot == "/" {
		fake := filepath.Join(o.stateDir, "fake-driver-root")
		roots = cdi.Roots{DriverRoot: fake, ContainerDriverRoot: fake}
	}
	// Device nodes for every minor a fleet may have, so that editing the
	// fleet file never leaves a GPU without its node.
	minors := make([]int, nvml.MaxFleetGPUs)
	for i := range minors {
		minors[i] = i
	}
	if err := cdi.MakeFakeDriverRoot(roots.ContainerDriverRoot, minors); err != nil {
		return nil, fmt.Errorf("make fake driver root %s: %w", roots.ContainerDriverRoot, err)
	}
	if err := cdi.MakeFakeMIGCaps(roots.ContainerDriverRoot, minors); err != nil {
		return nil, fmt.Errorf("make fake driver root %s: %w", roots.ContainerDriverRoot, err)
	}
	return &gpus{
		// Re-read on every rediscovery, so that a test can edit the fleet.
		inventory: nvml.NewFleetInventory(o.simulation.fleet, o.nodeName),
		nvml:      lib,
		mig:       mig.New(sim),
		// Simulated GPUs have no scheduler to configure; the setting is kept.
		slicer: &plugin.RecordedTimeSlices{},
		source: cdi.NewSimulatedSource(roots),
		roots:  roots,
	}, nil
}
