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
	"strings"
	"testing"

	"github.com/prismgpu/prism/internal/envflag"
)

// A release build has neither of the test build's flags, and refuses to
// start where the chart asked for simulated GPUs, rather than look for
// NVML on a node that has none.
func TestReleaseBuildHasNoSimulation(t *testing.T) {
	var o options
	flags := newFlags(&o)
	for _, name := range []string{"fleet", "simulated-faults"} {
		if flags.Lookup(name) != nil {
			t.Errorf("a release build has --%s", name)
		}
	}
	for _, tc := range []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{name: "no simulation", env: map[string]string{"NODE_NAME": "gpu-1"}},
		{name: "empty", env: map[string]string{"PRISM_FLEET": ""}},
		{name: "a fleet", env: map[string]string{"PRISM_FLEET": "/etc/prism/fleet/fleet.yaml"}, wantErr: "PRISM_FLEET is set, but this is a release build"},
		{name: "faults", env: map[string]string{"PRISM_SIMULATED_FAULTS": "/tmp/faults.jsonl"}, wantErr: "PRISM_SIMULATED_FAULTS is set, but this is a release build"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lookup := func(name string) (string, bool) { v, ok := tc.env[name]; return v, ok }
			o := options{}
			if err := envflag.Parse(newFlags(&o), nil, lookup); err != nil {
				t.Fatal(err)
			}
			err := o.simulation.validate(lookup)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("validate: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("validate: %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}
