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

package webhook

import (
	resourceapi "k8s.io/api/resource/v1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// HasGPURequest says whether a claim asks for a Prism GPU, in a request or
// in one of its subrequests: only such claims are the webhooks' business.
func HasGPURequest(spec *resourceapi.ResourceClaimSpec) bool {
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil && r.Exactly.DeviceClassName == rewrite.DeviceClassName {
			return true
		}
		for _, sub := range r.FirstAvailable {
			if rewrite.IsGPUClass(sub.DeviceClassName) {
				return true
			}
		}
	}
	return false
}

// ProfileOf is what the rewrite needs of a WorkloadProfile, with the
// cluster's policy where the profile sets none. The claim and the pod
// webhooks read a profile alike, so that they reach the same decision.
func ProfileOf(wp *prismv1alpha1.WorkloadProfile, clusterPolicy prismv1alpha1.Policy) rewrite.Profile {
	policy := clusterPolicy
	if wp.Spec.Policy != "" {
		policy = wp.Spec.Policy
	}
	return rewrite.Profile{
		Name:                 wp.Name,
		BoundType:            wp.Status.BoundType,
		MinMemory:            wp.Spec.MinMemory,
		PeakMemory:           wp.Status.PeakMemory,
		MinComputeCapability: wp.Spec.MinComputeCapability,
		Policy:               policy,
		ShareMemory:          wp.Spec.Sharing == prismv1alpha1.SharingFractional,
		Usage:                wp.Status.Usage,
		Exclusive:            wp.Spec.Sharing == prismv1alpha1.SharingExclusive,
	}
}
