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

package scenario

import (
	"encoding/json"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// why explains how the claim got its devices.
func why(pod *corev1.Pod, c *resourceapi.ResourceClaim) string {
	var parts []string
	if raw, ok := c.Annotations[rewrite.AnnotationKey]; ok {
		var plan rewrite.Plan
		if err := json.Unmarshal([]byte(raw), &plan); err != nil {
			return fmt.Sprintf("unreadable %s annotation: %v", rewrite.AnnotationKey, err)
		}
		tiers := strings.Join(uniq(subrequests(c)), ",")
		switch share := plan.Share; {
		case plan.BoundType == "":
			// Every plan has a bound type; the note on a claim sent to be
			// profiled instead has none, and names the profile.
			parts = append(parts, fmt.Sprintf("profile %q not measured yet: profiling run", plan.Profile))
		case share != nil && share.Verdict == rewrite.ShareSized.String() && share.Memory != nil:
			parts = append(parts, fmt.Sprintf("profile %q usage -> share %d%%%s %s first -> tier %s", plan.Profile, share.ComputePercent, rewrite.PeakText(share), share.Memory, tiers))
		case share != nil:
			parts = append(parts, fmt.Sprintf("profile %q %s/%s, no share (%s) -> tier %s", plan.Profile, plan.BoundType, plan.Policy, share.Verdict, tiers))
		default:
			parts = append(parts, fmt.Sprintf("profile %q %s/%s -> tier %s", plan.Profile, plan.BoundType, plan.Policy, tiers))
		}
		return strings.Join(parts, "; ")
	}
	spec := c.Spec.Devices
	for _, req := range spec.Requests {
		switch {
		case len(req.FirstAvailable) > 0:
			parts = append(parts, "firstAvailable -> "+strings.Join(uniq(subrequests(c)), ","))
		case req.Exactly != nil && len(req.Exactly.Selectors) > 0:
			parts = append(parts, "selector")
		}
		if req.Exactly != nil && req.Exactly.Capacity != nil && c.Status.Allocation != nil {
			for _, res := range c.Status.Allocation.Devices.Results {
				if q, ok := res.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]; ok && res.Request == req.Name && res.ShareID != nil {
					parts = append(parts, "memory share "+q.String())
				}
			}
		}
	}
	for _, con := range spec.Constraints {
		if con.MatchAttribute != nil {
			parts = append(parts, "matchAttribute "+strings.TrimPrefix(string(*con.MatchAttribute), gpuv1alpha1.DriverName+"/"))
		}
	}
	for _, cfg := range spec.Config {
		if cfg.Opaque == nil || cfg.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		var gc gpuv1alpha1.GpuConfig
		_ = json.Unmarshal(cfg.Opaque.Parameters.Raw, &gc)
		if gc.Sharing != nil {
			s := "GpuConfig " + string(gc.Sharing.Strategy)
			if gc.Sharing.TimeSlicing != nil {
				s += "/" + string(gc.Sharing.TimeSlicing.Interval)
			}
			parts = append(parts, s)
		}
		if gc.Profiling != nil && gc.Profiling.Enabled {
			parts = append(parts, "GpuConfig profiling")
		}
	}
	users := 0
	for _, ctr := range pod.Spec.Containers {
		for _, cl := range ctr.Resources.Claims {
			for _, prc := range pod.Spec.ResourceClaims {
				if prc.Name == cl.Name && claimOf(pod, prc) == c.Name {
					users++
				}
			}
		}
	}
	if users > 1 {
		parts = append(parts, fmt.Sprintf("claim shared by %d containers", users))
	}
	if n := len(c.Status.ReservedFor); n > 1 {
		parts = append(parts, fmt.Sprintf("claim shared by %d pods", n))
	}
	if len(parts) == 0 {
		return "plain"
	}
	return strings.Join(parts, "; ")
}

func claimOf(pod *corev1.Pod, prc corev1.PodResourceClaim) string {
	if prc.ResourceClaimName != nil {
		return *prc.ResourceClaimName
	}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.Name == prc.Name && st.ResourceClaimName != nil {
			return *st.ResourceClaimName
		}
	}
	return ""
}

// subrequests are the firstAvailable alternatives the allocator took.
func subrequests(c *resourceapi.ResourceClaim) []string {
	var out []string
	if c.Status.Allocation == nil {
		return nil
	}
	for _, res := range c.Status.Allocation.Devices.Results {
		if _, sub, ok := strings.Cut(res.Request, "/"); ok {
			out = append(out, sub)
		}
	}
	return out
}
