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

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// TestClientEditsGiveTheDaemonsSharedMemory: a share's containers have its
// daemon's shared-memory directory as /dev/shm, through which MPS clients
// and their server exchange memory.
func TestClientEditsGiveTheDaemonsSharedMemory(t *testing.T) {
	const pipe, shm = "/var/lib/prism/mps/c-gpu-0/pipe", "/var/lib/prism/mps/c-gpu-0/shm"
	options := []string{"rw", "nosuid", "nodev", "noexec", "bind"}
	want := []*cdispec.Mount{
		{HostPath: pipe, ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: options},
		{HostPath: shm, ContainerPath: "/dev/shm", Type: "bind", Options: options},
	}
	if diff := cmp.Diff(want, ClientEdits(pipe, shm, gpuv1alpha1.Share{ComputePercent: 40}).Mounts); diff != "" {
		t.Errorf("mounts (-want +got):\n%s", diff)
	}
}

func TestClientEdits(t *testing.T) {
	const pipe = "/var/lib/prism/mps/GPU-1/pipe"
	mount := []*cdispec.Mount{{HostPath: pipe, ContainerPath: "/tmp/nvidia-mps", Type: "bind", Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}}}
	for _, tc := range []struct {
		name    string
		share   gpuv1alpha1.Share
		wantEnv []string
	}{{
		// The hand-worked share: 45 % of the SMs and 8 GiB.
		name:  "compute and memory share",
		share: gpuv1alpha1.Share{ComputePercent: 45, MemoryBytes: 8 << 30},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=45",
			"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		name:    "the least compute is a limit",
		share:   gpuv1alpha1.Share{ComputePercent: 1},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=1"},
	}, {
		name:    "the most compute below the whole GPU is a limit",
		share:   gpuv1alpha1.Share{ComputePercent: 99},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=99"},
	}, {
		name:    "whole compute sets no thread limit",
		share:   gpuv1alpha1.Share{ComputePercent: 100, MemoryBytes: 8 << 30},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		// Outside the share's range; MPS would refuse a percentage above
		// 100, so none is set, as for the whole GPU.
		name:    "compute above the whole GPU sets no thread limit",
		share:   gpuv1alpha1.Share{ComputePercent: 101},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
	}, {
		name:    "memory is rounded down to whole MiB",
		share:   gpuv1alpha1.Share{MemoryBytes: 8<<30 + 1<<19},
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"},
	}, {
		name:    "no limits",
		wantEnv: []string{"CUDA_MPS_PIPE_DIRECTORY=/tmp/nvidia-mps"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			want := &cdispec.ContainerEdits{Env: tc.wantEnv, Mounts: mount}
			if diff := cmp.Diff(want, ClientEdits(pipe, "", tc.share)); diff != "" {
				t.Errorf("edits (-want +got):\n%s", diff)
			}
		})
	}
}
