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
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// Environment variables of MPS, as NVIDIA documents them.
const (
	EnvPipeDirectory          = "CUDA_MPS_PIPE_DIRECTORY"
	EnvLogDirectory           = "CUDA_MPS_LOG_DIRECTORY"
	EnvActiveThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
	EnvPinnedDeviceMemLimit   = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
)

// ContainerPipeDir is where a share's containers find their GPU's pipe
// directory. It is MPS's default, so that a process that clears its
// environment still reaches the daemon.
const ContainerPipeDir = "/tmp/nvidia-mps"

// ClientEdits are the container edits of one share enforced by MPS: its
// daemon's pipe directory, mounted at ContainerPipeDir, the daemon's
// shared-memory directory mounted at /dev/shm (none for a daemon of a
// whole GPU's shares, which had none), and the share's limits, where it
// names any (Share.LimitsCompute, Share.LimitsMemory). The daemon enforces
// the limits whatever the environment says; they are repeated here for
// the workload to read. The device ordinal of the memory limit is 0: the
// share's container sees its GPU alone. Memory is given in whole MiB,
// rounded down, so that the limit never exceeds the share.
func ClientEdits(hostPipeDir, hostShmDir string, s gpuv1alpha1.Share) *cdispec.ContainerEdits {
	env := []string{EnvPipeDirectory + "=" + ContainerPipeDir}
	if s.LimitsCompute() {
		env = append(env, EnvActiveThreadPercentage+"="+strconv.Itoa(int(s.ComputePercent)))
	}
	if s.LimitsMemory() {
		env = append(env, fmt.Sprintf("%s=0=%dM", EnvPinnedDeviceMemLimit, s.MemoryBytes>>mibShift))
	}
	options := []string{"rw", "nosuid", "nodev", "noexec", "bind"}
	mounts := []*cdispec.Mount{{HostPath: hostPipeDir, ContainerPath: ContainerPipeDir, Type: "bind", Options: options}}
	if hostShmDir != "" {
		mounts = append(mounts, &cdispec.Mount{HostPath: hostShmDir, ContainerPath: devShm, Type: "bind", Options: options})
	}
	return &cdispec.ContainerEdits{Env: env, Mounts: mounts}
}
