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

package validate

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// maxNamedShares is how many requests a denial names before it counts the
// rest: a claim may have 32 requests of 8 subrequests each.
const maxNamedShares = 3

// validateShareStrategies refuses a GpuConfig whose sharing strategy a
// share of a GPU cannot take (gpuv1alpha1.SharingStrategy.ShareConflict)
// on a request that asks for a share (gpuv1alpha1.SharedCapacities). The
// kubelet plugin refuses such a share too, but only once the pod is
// scheduled, which then hangs in ContainerCreating; here the author learns
// it at kubectl apply. An update is refused only where the old object had
// no such conflict: a claim created before this check, or while the
// webhook was down, must not keep its finalizers from being removed.
func validateShareStrategies[T any](req *admissionv1.AdmissionRequest, spec *resourceapi.ResourceClaimSpec, oldSpec func(*T) *resourceapi.ResourceClaimSpec, path *field.Path) field.ErrorList {
	errs := shareStrategyErrors(spec, path)
	if len(errs) == 0 || req.Operation != admissionv1.Update {
		return errs
	}
	old := new(T)
	if json.Unmarshal(req.OldObject.Raw, old) == nil && len(shareStrategyErrors(oldSpec(old), path)) > 0 {
		return nil
	}
	return errs
}

func shareStrategyErrors(spec *resourceapi.ResourceClaimSpec, path *field.Path) field.ErrorList {
	shares := shareRequests(spec.Devices.Requests)
	if len(shares) == 0 {
		return nil
	}
	var errs field.ErrorList
	for i, c := range spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != gpuv1alpha1.DriverName {
			continue
		}
		// A config that does not decode is validateDeviceConfigs' to report.
		cfg, err := gpuv1alpha1.Decode(c.Opaque.Parameters.Raw)
		if err != nil || cfg.Sharing == nil {
			continue
		}
		conflict := cfg.Sharing.Strategy.ShareConflict()
		if conflict == nil {
			continue
		}
		var given []share
		for _, s := range shares {
			if s.givenBy(c.Requests) {
				given = append(given, s)
			}
		}
		if len(given) == 0 {
			continue
		}
		errs = append(errs, field.Invalid(path.Index(i).Child("opaque", "parameters", "sharing", "strategy"), string(cfg.Sharing.Strategy),
			fmt.Sprintf("%s: %v; remove the sharing configuration, or the amounts to ask for a whole GPU", describeShares(given), conflict)))
	}
	return errs
}

// share is a request, or a subrequest of one, that asks for a share of a
// GPU.
type share struct {
	request, subrequest string
	capacities          []gpuv1alpha1.CapacityName
}

func shareRequests(requests []resourceapi.DeviceRequest) []share {
	var out []share
	for _, r := range requests {
		if r.Exactly != nil {
			if c := gpuv1alpha1.SharedCapacities(r.Exactly.Capacity); len(c) > 0 {
				out = append(out, share{request: r.Name, capacities: c})
			}
		}
		for _, sub := range r.FirstAvailable {
			if c := gpuv1alpha1.SharedCapacities(sub.Capacity); len(c) > 0 {
				out = append(out, share{request: r.Name, subrequest: sub.Name, capacities: c})
			}
		}
	}
	return out
}

func (s share) name() string {
	if s.subrequest == "" {
		return s.request
	}
	return s.request + "/" + s.subrequest
}

// givenBy says whether a config for requests applies to the share, as the
// API defines it: a config for no request applies to every request, one
// for a request to all of its subrequests, and one for "request/sub" to
// that subrequest.
func (s share) givenBy(requests []string) bool {
	return len(requests) == 0 || slices.Contains(requests, s.request) || s.subrequest != "" && slices.Contains(requests, s.name())
}

// describeShares is `request "gpu", which names an amount of
// gpu.prism.dev/memory, asks for a share of a GPU`, naming at most
// maxNamedShares requests, each quoted to at most 64 bytes.
func describeShares(shares []share) string {
	var names []string
	var capacities []string
	for i, s := range shares {
		if i < maxNamedShares {
			names = append(names, fmt.Sprintf("%.64q", s.name()))
		}
		for _, c := range s.capacities {
			if q := string(c.Qualified()); !slices.Contains(capacities, q) {
				capacities = append(capacities, q)
			}
		}
	}
	if len(shares) == 1 {
		amounts := "an amount of " + capacities[0]
		if len(capacities) > 1 {
			amounts = "amounts of " + strings.Join(capacities, " and ")
		}
		return fmt.Sprintf("request %s, which names %s, asks for a share of a GPU", names[0], amounts)
	}
	list := strings.Join(names, ", ")
	if more := len(shares) - len(names); more > 0 {
		list += fmt.Sprintf(" and %d more", more)
	}
	return fmt.Sprintf("requests %s, which name amounts of %s, ask for shares of a GPU", list, strings.Join(capacities, " or "))
}
