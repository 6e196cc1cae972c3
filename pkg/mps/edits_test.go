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

package mps

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func TestClientEdits(t *testing.T) {
	const pipe = "/var/lib/prism/mps/GPU-1/pipe"
	mount := []*cdispec.Mount{{HostPath: pipe, ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}}}
	for _, tc := range []struct {
		name    string
		limits  Limits
		wantEnv []string
	}{{
		// The hand-worked share: 45 % of the SMs and 8 GiB.
		name:   "compute and memory share",
		limits: Limits{ComputePercent: 45, MemoryBytes: 8 << 30},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=45",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		name:    "whole compute sets no thread limit",
		limits:  Limits{ComputePercent: 100, MemoryBytes: 8 << 30},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		name:    "memory is rounded down to whole MiB",
		limits:  Limits{MemoryBytes: 8<<30 + 1<<19},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		name:    "no limits",
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			want := &cdispec.ContainerEdits{Env: tc.wantEnv, Mounts: mount}
			if diff := cmp.Diff(want, ClientEdits(pipe, tc.limits)); diff != "" {
				t.Errorf("edits (-want +got):\n%s", diff)
			}
		})
	}
}
