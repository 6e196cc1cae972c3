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
	"testing"

	"github.com/prismgpu/prism/internal/envflag/envflagtest"
)

// The chart's simulation.fleet reaches a test build as PRISM_FLEET.
func TestSimulationFlags(t *testing.T) {
	envflagtest.Mirrors(t, newFlags, map[string]string{
		"fleet":            "PRISM_FLEET",
		"simulated-faults": "PRISM_SIMULATED_FAULTS",
	})
	envflagtest.Run(t, newFlags, []envflagtest.Case[options]{{
		Name:  "a fleet from the environment",
		Env:   map[string]string{"PRISM_FLEET": "/etc/prism/fleet/fleet.yaml"},
		Check: func(o options) bool { return o.simulation.fleet == "/etc/prism/fleet/fleet.yaml" },
	}})
	for _, tc := range []struct {
		name    string
		sim     simulationOptions
		wantErr bool
	}{
		{name: "a fleet", sim: simulationOptions{fleet: "fleet.yaml"}},
		{name: "a fleet and faults", sim: simulationOptions{fleet: "fleet.yaml", faults: "faults.jsonl"}},
		{name: "faults without a fleet", sim: simulationOptions{faults: "faults.jsonl"}, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.sim.validate(nil); (err != nil) != tc.wantErr {
				t.Errorf("validate = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}
