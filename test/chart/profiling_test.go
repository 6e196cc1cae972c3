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

package chart

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestProfileReportDirectoriesAreBounded: a privileged plugin that profiles
// mounts a size-limited tmpfs per claim in the state dir, which the
// container runtime on the host sees only through Bidirectional
// propagation; an unprivileged plugin could not mount it, so it is told not
// to try rather than to warn at every start.
func TestProfileReportDirectoriesAreBounded(t *testing.T) {
	tests := map[string]struct {
		args            []string
		wantSize        string
		wantPropagation corev1.MountPropagationMode
	}{
		"real node":            {wantSize: "256Mi", wantPropagation: corev1.MountPropagationBidirectional},
		"chosen size":          {args: []string{"--set", "profiling.dirSize=64Mi"}, wantSize: "64Mi", wantPropagation: corev1.MountPropagationBidirectional},
		"profiling disabled":   {args: []string{"--set", "profiling.enabled=false"}, wantSize: "256Mi"},
		"unprivileged":         {args: []string{"--set", "kubeletPlugin.privileged=false"}, wantSize: "0"},
		"simulated node":       {args: []string{"--set-string", "simulation.fleet=gpus: []"}, wantSize: "0"},
		"privileged simulated": {args: []string{"--set-string", "simulation.fleet=gpus: []", "--set", "kubeletPlugin.privileged=true"}, wantSize: "256Mi", wantPropagation: corev1.MountPropagationBidirectional},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			c := container(t, render(t, tc.args...).plugin(t), "kubelet-plugin")
			size := "(unset)"
			for _, e := range c.Env {
				if e.Name == "PRISM_PROFILE_DIR_SIZE" {
					size = e.Value
				}
			}
			if size != tc.wantSize {
				t.Errorf("PRISM_PROFILE_DIR_SIZE=%s, want %s", size, tc.wantSize)
			}
			var propagation corev1.MountPropagationMode
			found := false
			for _, m := range c.VolumeMounts {
				if m.Name == "state" {
					found = true
					if m.MountPropagation != nil {
						propagation = *m.MountPropagation
					}
				}
			}
			if !found || propagation != tc.wantPropagation {
				t.Errorf("state dir mounted (%v) with propagation %q, want %q", found, propagation, tc.wantPropagation)
			}
		})
	}
}
