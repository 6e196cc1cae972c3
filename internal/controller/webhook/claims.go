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
	"fmt"

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

// WithinAPILimits checks the counts of a claim's lists against the limits
// of resource.k8s.io/v1, which the API server enforces: a claim beyond them
// never came from it, and the rewrite's work grows with them.
func WithinAPILimits(spec *resourceapi.ResourceClaimSpec) error {
	d := &spec.Devices
	if len(d.Requests) > resourceapi.DeviceRequestsMaxSize || len(d.Constraints) > resourceapi.DeviceConstraintsMaxSize || len(d.Config) > resourceapi.DeviceConfigMaxSize {
		return fmt.Errorf("%d requests, %d constraints and %d configs: beyond the API's limits (%d, %d, %d)",
			len(d.Requests), len(d.Constraints), len(d.Config), resourceapi.DeviceRequestsMaxSize, resourceapi.DeviceConstraintsMaxSize, resourceapi.DeviceConfigMaxSize)
	}
	for _, r := range d.Requests {
		if len(r.FirstAvailable) > resourceapi.FirstAvailableDeviceRequestMaxSize {
			return fmt.Errorf("request %.64q has %d subrequests, beyond the API's limit of %d", r.Name, len(r.FirstAvailable), resourceapi.FirstAvailableDeviceRequestMaxSize)
		}
		if r.Exactly != nil && len(r.Exactly.Selectors) > resourceapi.DeviceSelectorsMaxSize {
			return fmt.Errorf("request %.64q has %d selectors, beyond the API's limit of %d", r.Name, len(r.Exactly.Selectors), resourceapi.DeviceSelectorsMaxSize)
		}
		for _, sub := range r.FirstAvailable {
			if len(sub.Selectors) > resourceapi.DeviceSelectorsMaxSize {
				return fmt.Errorf("subrequest %.64q has %d selectors, beyond the API's limit of %d", sub.Name, len(sub.Selectors), resourceapi.DeviceSelectorsMaxSize)
			}
		}
	}
	return nil
}

// ProfileOf is what the rewrite needs of a WorkloadProfile, with the
// cluster's policy where the profile sets none. The claim and the pod
// webhooks read a profile alike, so that they reach the same decision.
func ProfileOf(wp *prismv1alpha1.WorkloadProfile, clusterPolicy prismv1alpha1.Policy) rewrite.Profile {
	policy := clusterPolicy
	if wp.Spec.Policy != "" {
		policy = wp.Spec.Policy
	}
	// The bound type is read as stored, never re-derived: a profile
	// written before status.boundTimeShares existed keeps the class of its
	// averaged throughputs, and is placed by it, until the workload is
	// profiled again.
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
		Kernels:              rewrite.KernelShape{WavesPerSM: wp.Status.WavesPerSM, DRAMThroughputMilliPercent: wp.Status.DRAMThroughputMilliPercent},
	}
}
