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
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
)

// DefaultUsageInterval is how often prepared claims' GPUs are sampled
// unless --usage-interval says otherwise.
const DefaultUsageInterval = sampler.DefaultInterval

// usageDir, under the state directory, holds the sampler's record of each
// claim's run.
const usageDir = "usage"

// usageClaims are the claims a prepare completed, as the sampler tracks
// them: with the profile their annotation names and the pods that reserved
// them.
func (s *deviceState) usageClaims(claims []*resourceapi.ResourceClaim, done []checkpoint.Claim) []sampler.Claim {
	var out []sampler.Claim
	for _, rec := range done {
		i := slices.IndexFunc(claims, func(c *resourceapi.ResourceClaim) bool { return string(c.UID) == rec.UID })
		if i < 0 {
			continue
		}
		claim := claims[i]
		uc := s.usageClaim(rec)
		// An invalid annotation names none; plan logged why.
		uc.Profile, _ = prismv1alpha1.ProfileName(claim.Annotations)
		for _, ref := range claim.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				uc.Pods = append(uc.Pods, sampler.Pod{Name: ref.Name, UID: ref.UID})
			}
		}
		out = append(out, uc)
	}
	return out
}

// usageClaim is what the checkpoint says of a claim's GPUs: which are
// shared, and through MPS, the share and the model.
func (s *deviceState) usageClaim(rec checkpoint.Claim) sampler.Claim {
	c := sampler.Claim{Ref: prismv1alpha1.ClaimReference{Namespace: rec.Namespace, Name: rec.Name, UID: types.UID(rec.UID)}, Profiled: rec.Profiling != nil}
	for _, dev := range rec.Devices {
		g, ok := s.gpus.get(dev.Name)
		if !ok {
			continue
		}
		c.ProductName = g.ProductName
		// A share of the whole GPU (what a claim naming no amount gets
		// where GPUs are published shareable) has the GPU alone: its
		// figures are the claim's, and it is no share to outgrow.
		partial, _ := s.sharedDevice([]checkpoint.Device{dev})
		gpu := sampler.GPU{UUID: g.UUID, Shared: partial != "", MPS: dev.Sharing != nil && dev.Sharing.MPS}
		if gpu.MPS && dev.Sharing.MPSDaemon != "" {
			// The share's daemon's server serves the share alone. Without
			// the daemon's record it stays empty, and the server is taken
			// for any MPS share's, as a GPU-wide daemon's is.
			gpu.MPSPipeDir = s.checkpoint.MPSDaemons()[dev.Sharing.MPSDaemon].PipeDir
		}
		c.GPUs = append(c.GPUs, gpu)
		if partial != "" && dev.ShareID != "" && c.Share == nil && dev.Sharing != nil {
			// What the run was held to, so that a run at its limit counts
			// as outgrowing it; a copy, as rec may be the checkpoint's own.
			share := dev.Sharing.Limits()
			c.Share = &share
		}
	}
	return c
}
