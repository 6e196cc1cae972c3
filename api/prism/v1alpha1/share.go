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

package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// NewGrantedShare is s as a WorkloadProfile's status records it. The
// status keeps memory as a quantity, as every memory figure of the profile,
// and leaves out a memory of 0, which names no amount; the compute is
// copied, in the same range.
func NewGrantedShare(s gpuv1alpha1.Share) *GrantedShare {
	g := &GrantedShare{ComputePercent: s.ComputePercent}
	if s.LimitsMemory() {
		g.Memory = resource.NewQuantity(s.MemoryBytes, resource.BinarySI)
	}
	return g
}
