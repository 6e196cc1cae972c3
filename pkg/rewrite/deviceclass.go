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

package rewrite

import gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"

// DeviceClassName is the only device class whose requests get rewritten:
// the DeviceClass the chart installs for gpu.prism.dev GPUs, named after the
// driver.
const DeviceClassName = "gpu.prism.dev"

// TierDeviceClassName is the DeviceClass of the subrequests Rewrite writes.
// It has no selectors, so the allocator pays no class evaluation per device
// and subrequest: on a node where a tier fails, that halves the evaluations
// (8 instead of 16 for 8 GPUs). The chart installs it beside DeviceClassName.
//
// A class without selectors matches every driver's devices, so it is used
// only where the subrequest's first selector is a generated one: every
// catalogue entry requires a gpu.prism.dev attribute or capacity, so foreign
// devices are out before any user selector runs. Otherwise the subrequest
// keeps the user's class.
//
// The name sits under the driver's domain, as the bandwidth classes do, and
// says who writes it: it appears only in claims the webhook rewrote, next to
// the prism.dev/rewrite annotation. Rewrite never rewrites a request of this
// class again.
const TierDeviceClassName = "rewrite." + gpuv1alpha1.DriverName

// IsGPUClass reports whether a request of this class asks for Prism GPUs:
// the class users write, or the one of subrequests Rewrite wrote.
func IsGPUClass(name string) bool {
	return name == DeviceClassName || name == TierDeviceClassName
}
