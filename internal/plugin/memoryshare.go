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

package plugin

import (
	"fmt"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
)

// EnvMemoryLimit is the bytes of GPU memory the claim's share holds. It is
// advisory: nothing on the GPU enforces it without a layer such as
// HAMi-core that intercepts CUDA allocations.
const EnvMemoryLimit = "PRISM_GPU_MEMORY_LIMIT"

// memoryShareEnv tells the containers of a share of a GPU's memory how much
// it holds.
func memoryShareEnv(s *checkpoint.Sharing) []string {
	if s == nil || !s.Share.LimitsMemory() {
		return nil
	}
	return []string{fmt.Sprintf("%s=%d", EnvMemoryLimit, s.Share.MemoryBytes)}
}
