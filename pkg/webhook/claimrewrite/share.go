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

package claimrewrite

import (
	"encoding/json"
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// explicitSharing is the part of a GpuConfig the share step reads, decoded
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

// exclusiveRequests returns the GPU requests of spec that a GpuConfig of the
// claim puts on strategy Exclusive explicitly: they keep whole GPUs.
func exclusiveRequests(spec *resourceapi.ResourceClaimSpec) []string {
	return requestsWithStrategy(spec, func(s gpuv1alpha1.SharingStrategy) bool { return s == gpuv1alpha1.ExclusiveSharing })
}

// noShareRequests returns the GPU requests of spec that a GpuConfig of the
// claim gives a strategy a share cannot take (TimeSlicing): the rewrite
// must not make them shares, which the validating webhook would refuse.
func noShareRequests(spec *resourceapi.ResourceClaimSpec) []string {
	return requestsWithStrategy(spec, func(s gpuv1alpha1.SharingStrategy) bool { return s.ShareConflict() != nil })
}

// requestsWithStrategy returns the GPU requests of spec that a GpuConfig of
// the claim gives a strategy that match says yes to. A config that names
// no requests applies to all of them. A config that names no strategy, or
// does not decode, says nothing here; the validating webhook rejects one
// that does not decode, and the kubelet plugin refuses it at prepare.
func requestsWithStrategy(spec *resourceapi.ResourceClaimSpec, match func(gpuv1alpha1.SharingStrategy) bool) []string {
	var all bool
	named := map[string]bool{}
	for _, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		var cfg explicitSharing
		if err := json.Unmarshal(c.Opaque.Parameters.Raw, &cfg); err != nil ||
			cfg.APIVersion != gpuv1alpha1.SchemeGroupVersion.String() || cfg.Kind != gpuv1alpha1.GpuConfigKind ||
			cfg.Sharing == nil || cfg.Sharing.Strategy == "" || !match(cfg.Sharing.Strategy) {
			continue
		}
		if len(c.Requests) == 0 {
			all = true
		}
		for _, r := range c.Requests {
			// "request/subrequest" names a subrequest the user wrote; the
			// share step leaves firstAvailable requests alone anyway.
			named[r] = true
		}
	}
	var out []string
	for _, r := range spec.Devices.Requests {
		if all || named[r.Name] {
			out = append(out, r.Name)
		}
	}
	return out
}

// shareSummary is the Shared event's word on the share: "gpu gets 45%
// compute, 8Gi memory of a shareable GPU first (duty cycle p50 16% p95
// 32%, peak memory 6Gi, 3 runs), a whole GPU after".
func shareSummary(p *rewrite.Plan) string {
	s := p.Share
	if s == nil || s.Verdict != rewrite.ShareSized.String() || s.Memory == nil {
		return ""
	}
	text := fmt.Sprintf("%s %s %d%% compute, %s memory of a shareable GPU first",
		strings.Join(s.Requests, ", "), verb(len(s.Requests)), s.ComputePercent, s.Memory.String())
	if s.Usage != "" {
		text += " (" + s.Usage + ")"
	}
	return text + ", a whole GPU after"
}

func verb(n int) string {
	if n == 1 {
		return "gets"
	}
	return "get"
}
