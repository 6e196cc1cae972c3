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

// Limits of the status fields that Prism fills from what a report, a file
// beside it or a flag says. The API server refuses a whole status for one
// field beyond them, and the profile with it, so the writers (pkg/profile)
// hold every value to them first. The markers in workloadprofile_types.go
// repeat the numbers, since a marker takes no constant; TestCRDLimits keeps
// markers, manifest and constants equal.
const (
	// MaxNCUVersionLength bounds status.ncuVersion.
	MaxNCUVersionLength = 64
	// MaxProductNameLength bounds status.device.productName.
	MaxProductNameLength = 256
	// MaxKernelNameLength bounds status.topKernels[].name.
	MaxKernelNameLength = 512
	// MaxTopKernels bounds the items of status.topKernels.
	MaxTopKernels = 10
	// ComputeCapabilityPattern is the pattern of
	// status.device.computeCapability and spec.minComputeCapability:
	// "major.minor".
	ComputeCapabilityPattern = `^[0-9]{1,2}\.[0-9]{1,2}$`
)
