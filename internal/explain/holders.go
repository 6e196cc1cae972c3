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

package explain

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// DeviceID names a published device.
type DeviceID struct {
	Driver, Pool, Device string
}

// Holder is a claim a device is allocated to.
type Holder struct {
	Namespace, Name string
	// Request is the claim's request (or "request/subrequest") the device
	// serves.
	Request string
	// Pods are those the claim is reserved for: the ones using the device.
	Pods []string
	// Shared is true when the device was allocated as one of several
	// allocations; Memory and Compute are the shares of memory and of
	// compute (per cent) then, when known. Fleet and Explain count a share
	// that leaves no room for another as the whole GPU, not shared (see
	// onDevice).
	Shared  bool
	Memory  *resource.Quantity
	Compute *resource.Quantity
}

// Claim is "namespace/name".
func (h Holder) Claim() string {
	return h.Namespace + "/" + h.Name
}

// Share is "whole GPU", "shared", "shared 20Gi" or "shared 45% 8Gi".
func (h Holder) Share() string {
	if !h.Shared {
		return "whole GPU"
	}
	out := "shared"
	// A claim that names no compute reserves none: say nothing rather
	// than "0%".
	if h.Compute != nil && !h.Compute.IsZero() {
		out += " " + h.Compute.String() + "%"
	}
	if h.Memory != nil {
		out += " " + h.Memory.String()
	}
	return out
}

// String is "ml/train-0 (whole GPU)".
func (h Holder) String() string {
	return fmt.Sprintf("%s (%s)", h.Claim(), h.Share())
}

// Holders returns, for every allocated device, the claims holding it,
// sorted by namespace and name. It reads allocations only, as the
// scheduler does: a claim holds its devices until it is deallocated, even
// after its pods are gone.
func Holders(claims []resourceapi.ResourceClaim) map[DeviceID][]Holder {
	out := make(map[DeviceID][]Holder)
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		var pods []string
		for _, ref := range c.Status.ReservedFor {
			if ref.Resource == "pods" && ref.APIGroup == "" {
				pods = append(pods, ref.Name)
			}
		}
		slices.Sort(pods)
		for _, r := range c.Status.Allocation.Devices.Results {
			id := DeviceID{Driver: r.Driver, Pool: r.Pool, Device: r.Device}
			h := Holder{Namespace: c.Namespace, Name: c.Name, Request: r.Request, Pods: pods,
				Shared: r.ShareID != nil || len(r.ConsumedCapacity) > 0}
			if q, ok := capacity(r.ConsumedCapacity, r.Driver, gpuv1alpha1.MemoryCapacity); ok {
				h.Memory = &q
			}
			if q, ok := capacity(r.ConsumedCapacity, r.Driver, gpuv1alpha1.ComputeCapacity); ok {
				h.Compute = &q
			}
			out[id] = append(out[id], h)
		}
	}
	for _, hs := range out {
		slices.SortFunc(hs, func(a, b Holder) int {
			return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Request, b.Request))
		})
	}
	return out
}

// onDevice returns holders as device d sees them: a share that leaves less
// memory or compute beside it than the smallest share d grants holds d
// whole. That is what a claim that names no amount gets on a GPU published
// shareable: the default share, all of its memory rounded down to the
// step and all of its compute. holders is not modified.
func onDevice(holders []Holder, d resourceapi.Device, driver string) []Holder {
	if len(holders) == 0 {
		return holders
	}
	out := slices.Clone(holders)
	for _, c := range []struct {
		name gpuv1alpha1.CapacityName
		of   func(Holder) *resource.Quantity
	}{
		{gpuv1alpha1.MemoryCapacity, func(h Holder) *resource.Quantity { return h.Memory }},
		{gpuv1alpha1.ComputeCapacity, func(h Holder) *resource.Quantity { return h.Compute }},
	} {
		total, ok := deviceCapacityOf(d, driver, c.name)
		if !ok {
			continue
		}
		for i, h := range out {
			if !h.Shared || c.of(h) == nil {
				continue
			}
			left := total.Value.DeepCopy()
			left.Sub(*c.of(h))
			if left.Cmp(smallestShare(total)) < 0 {
				out[i].Shared = false
			}
		}
	}
	return out
}

// smallestShare is the least of a capacity a claim can be granted on a
// device.
func smallestShare(memory resourceapi.DeviceCapacity) resource.Quantity {
	if p := memory.RequestPolicy; p != nil && p.ValidRange != nil && p.ValidRange.Min != nil {
		return *p.ValidRange.Min
	}
	return resource.MustParse("1")
}

// others returns the holders that are not the claim ns/name.
func others(holders []Holder, namespace, name string) []Holder {
	var out []Holder
	for _, h := range holders {
		if h.Namespace != namespace || h.Name != name {
			out = append(out, h)
		}
	}
	return out
}

// joinHolders is the HELD BY column: "-" for a free device.
func joinHolders(holders []Holder) string {
	if len(holders) == 0 {
		return "-"
	}
	parts := make([]string, len(holders))
	for i, h := range holders {
		parts[i] = h.String()
	}
	return strings.Join(parts, ", ")
}

// capacity looks a capacity up under its short and its driver-qualified
// name; the plugin publishes the qualified one.
func capacity(m map[resourceapi.QualifiedName]resource.Quantity, driver string, name gpuv1alpha1.CapacityName) (resource.Quantity, bool) {
	for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(driver + "/" + string(name))} {
		if q, ok := m[key]; ok {
			return q, true
		}
	}
	return resource.Quantity{}, false
}
