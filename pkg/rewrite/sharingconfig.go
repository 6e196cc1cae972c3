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

import (
	"encoding/json"
	"slices"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// sharingChoices are what a claim's GpuConfigs say of sharing, by request.
type sharingChoices struct {
	// exclusive are the requests whose GpuConfig sets sharing.strategy
	// Exclusive itself (not by default): they never get a share or a
	// partition. See docs/sharing.md.
	exclusive map[string]bool
	// noShare are the requests whose GpuConfig sets a sharing strategy
	// that a share cannot take (TimeSlicing; see
	// gpuv1alpha1.SharingStrategy.ShareConflict). They get no amount of a
	// shareable capacity (gpuv1alpha1.SharedCapacities): no share, no
	// memory share, and the memory floor in CEL, because any amount would
	// make them a share, which the validating webhook refuses and the
	// kubelet plugin does not prepare.
	noShare map[string]bool
}

// explicitSharing is the part of a GpuConfig that sharingOf reads, decoded
// without gpuv1alpha1.Decode: Decode fills in strategy Exclusive where the
// user wrote none, and only a strategy the user wrote says "never share
// me".
type explicitSharing struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Sharing    *struct {
		Strategy gpuv1alpha1.SharingStrategy `json:"strategy"`
	} `json:"sharing"`
}

// sharingOf reads the sharing strategies that the claim's GpuConfigs write.
// A config that names no requests applies to all of them. A config that
// names no strategy, or does not decode, says nothing here; the validating
// webhook rejects one that does not decode, and the kubelet plugin refuses
// it at prepare.
func sharingOf(spec *resourceapi.ResourceClaimSpec) sharingChoices {
	s := sharingChoices{exclusive: map[string]bool{}, noShare: map[string]bool{}}
	for _, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		var cfg explicitSharing
		if err := json.Unmarshal(c.Opaque.Parameters.Raw, &cfg); err != nil ||
			cfg.APIVersion != gpuv1alpha1.SchemeGroupVersion.String() || cfg.Kind != gpuv1alpha1.GpuConfigKind ||
			cfg.Sharing == nil || cfg.Sharing.Strategy == "" {
			continue
		}
		strategy := cfg.Sharing.Strategy
		for _, r := range spec.Devices.Requests {
			// "request/subrequest" names a subrequest the user wrote; the
			// steps leave firstAvailable requests alone anyway.
			if len(c.Requests) > 0 && !slices.Contains(c.Requests, r.Name) {
				continue
			}
			if strategy == gpuv1alpha1.ExclusiveSharing {
				s.exclusive[r.Name] = true
			}
			if strategy.ShareConflict() != nil {
				s.noShare[r.Name] = true
			}
		}
	}
	return s
}
