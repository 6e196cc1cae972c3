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

// Limits are what one share may use of its GPU.
type Limits struct {
	// ComputePercent is the share of the GPU's SMs; 0 or 100 and above set
	// no limit.
	ComputePercent int32
	// MemoryBytes is the share's device memory; 0 sets no limit, nor does
	// the whole GPU.
	MemoryBytes int64
}

// ClientEdits are the container edits of one share enforced by MPS: the
// GPU's pipe directory, mounted at ContainerPipeDir, and the share's limits.
// The device ordinal of the memory limit is 0: the share's container sees
// its GPU alone. Memory is given in whole MiB, rounded down, so that the
// limit never exceeds the share.
func ClientEdits(hostPipeDir string, l Limits) *cdispec.ContainerEdits {
	env := []string{EnvPipeDirectory + "=" + ContainerPipeDir}
	if l.ComputePercent > 0 && l.ComputePercent < 100 {
		env = append(env, EnvActiveThreadPercentage+"="+strconv.Itoa(int(l.ComputePercent)))
	}
	if l.MemoryBytes > 0 {
		env = append(env, fmt.Sprintf("%s=0=%dM", EnvPinnedDeviceMemLimit, l.MemoryBytes>>20))
	}
	return &cdispec.ContainerEdits{
		Env: env,
		Mounts: []*cdispec.Mount{{
			HostPath: hostPipeDir, ContainerPath: ContainerPipeDir, Type: "bind",
			Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"},
		}},
	}
}
