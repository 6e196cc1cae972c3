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

// Package explain tells, for every device of a cluster, which alternative
// of a ResourceClaim it satisfies, or which selector rules it out, and
// which claims hold it. It evaluates selectors with the CEL library
// kube-scheduler uses, so a verdict here is the verdict the scheduler
// reaches on the device's attributes. Of availability it reports who holds
// a device, from the claims' allocations; node fit and remaining shared
// capacity are the scheduler's business.
package explain

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// Row is the verdict for one device and one request of the claim.
type Row struct {
	Node, Pool, Device string
	// Product and Class are the device's productName and bandwidthClass.
	Product, Class string
	// Partition is, for a MIG partition, its profile at its first memory
	// slice ("3g.20gb@0"); empty for a whole GPU.
	Partition string
	// Request is the claim's request.
	Request string
	// Matched names the first alternative (the request itself, or a
	// subrequest) the device satisfies; empty when rejected.
	Matched string
	// Verdict is "matches <alternative>" or "rejected: <reason>".
	Verdict string
	// Allocated is the allocation result's request ("gpu/ultra") when the
	// scheduler gave this device to this request.
	Allocated string
	// HeldBy are the other claims the device is allocated to.
	HeldBy []Holder
}

// alternative is one way of satisfying a request, in preference order.
type alternative struct {
	name      string
	class     string
	selectors []resourceapi.DeviceSelector
}

// Explain evaluates every device in slices against every request of claim.
// classes are the DeviceClasses the claim refers to; a missing one rejects
// its alternatives. holders (from Holders) say which other claims hold a
// device; a match on a device another claim holds says so. Slices of an
// outdated pool generation are ignored, as the scheduler does. Rows are
// sorted by node, device and request.
func Explain(ctx context.Context, claim *resourceapi.ResourceClaim, resourceSlices []resourceapi.ResourceSlice, classes []resourceapi.DeviceClass, holders map[DeviceID][]Holder) []Row {
	compiler := cel.NewCache(32, cel.Features{})
	classByName := make(map[string]*resourceapi.DeviceClass, len(classes))
	for i := range classes {
		classByName[classes[i].Name] = &classes[i]
	}
	allocated := make(map[[3]string]string)
	if a := claim.Status.Allocation; a != nil {
		for _, r := range a.Devices.Results {
			allocated[[3]string{r.Driver, r.Pool, r.Device}] = r.Request
		}
	}

	current := currentSlices(resourceSlices)
	use := newCounterUse(current)
	// A device that shares counters with one another claim holds (a
	// partition of the same GPU, or the GPU itself) is blocked; this
	// claim's own allocation does not block it.
	heldByOthers := make(map[DeviceID][]Holder, len(holders))
	for id, hs := range holders {
		if o := others(hs, claim.Namespace, claim.Name); len(o) > 0 {
			heldByOthers[id] = o
		}
	}
	var rows []Row
	for _, s := range current {
		node := sliceNode(s)
		for _, d := range s.Spec.Devices {
			device := cel.Device{Driver: s.Spec.Driver, Attributes: d.Attributes, Capacity: d.Capacity, AllowMultipleAllocations: d.AllowMultipleAllocations}
			for _, req := range claim.Spec.Devices.Requests {
				row := Row{
					Node: node, Pool: s.Spec.Pool.Name, Device: d.Name, Request: req.Name,
					Product: stringAttribute(d, s.Spec.Driver, gpuv1alpha1.ProductNameAttribute),
					Class:   stringAttribute(d, s.Spec.Driver, gpuv1alpha1.BandwidthClassAttribute),
				}
				if d.NodeName != nil {
					row.Node = *d.NodeName
				}
				id := DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
				if _, ok := use.profile[id]; ok {
					row.Partition = use.label(id)
				}
				row.Matched, row.Verdict = verdict(ctx, compiler, classByName, alternatives(req), device)
				if r, ok := allocated[[3]string{s.Spec.Driver, s.Spec.Pool.Name, d.Name}]; ok && parent(r) == req.Name {
					row.Allocated = r
				}
				row.HeldBy = others(onDevice(holders[id], d, s.Spec.Driver), claim.Namespace, claim.Name)
				if row.Matched != "" {
					if len(row.HeldBy) > 0 {
						row.Verdict += availability(row.HeldBy, d, s.Spec.Driver)
					} else if bs := use.blockers(id, heldByOthers); len(bs) > 0 {
						row.Verdict += ", but " + use.describe(bs)
					}
				}
				rows = append(rows, row)
			}
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device), cmp.Compare(a.Request, b.Request))
	})
	return rows
}

// availability qualifies a match on a device other claims hold: it is of
// no use to this claim when one holds it whole, or when the shares leave
// less memory or compute than the smallest share the device grants.
func availability(heldBy []Holder, d resourceapi.Device, driver string) string {
	if len(heldBy) == 0 {
		return ""
	}
	claims := make([]string, len(heldBy))
	for i, h := range heldBy {
		if !h.Shared {
			return ", but " + h.Claim() + " holds it"
		}
		claims[i] = h.Claim()
	}
	with := strings.Join(claims, ", ")
	var free []string
	for _, c := range []struct {
		name       gpuv1alpha1.CapacityName
		of         func(Holder) *resource.Quantity
		unit, noun string
	}{
		{gpuv1alpha1.ComputeCapacity, func(h Holder) *resource.Quantity { return h.Compute }, "%", "compute"},
		{gpuv1alpha1.MemoryCapacity, func(h Holder) *resource.Quantity { return h.Memory }, "", "memory"},
	} {
		total, ok := deviceCapacityOf(d, driver, c.name)
		if !ok {
			continue
		}
		left := total.Value.DeepCopy()
		for _, h := range heldBy {
			if q := c.of(h); q != nil {
				left.Sub(*q)
			}
		}
		if left.Cmp(smallestShare(total)) < 0 {
			return ", but its " + c.noun + " is held by " + with
		}
		free = append(free, left.String()+c.unit+" of "+c.noun)
	}
	if len(free) == 0 {
		return ", shared with " + with
	}
	return fmt.Sprintf(", %s free (shared with %s)", strings.Join(free, " and "), with)
}

// currentSlices drops slices of a pool generation that has been replaced;
// during an update both can exist for a while.
func currentSlices(in []resourceapi.ResourceSlice) []resourceapi.ResourceSlice {
	latest := make(map[[2]string]int64)
	for _, s := range in {
		k := [2]string{s.Spec.Driver, s.Spec.Pool.Name}
		latest[k] = max(latest[k], s.Spec.Pool.Generation)
	}
	var out []resourceapi.ResourceSlice
	for _, s := range in {
		if s.Spec.Pool.Generation == latest[[2]string{s.Spec.Driver, s.Spec.Pool.Name}] {
			out = append(out, s)
		}
	}
	return out
}

func alternatives(req resourceapi.DeviceRequest) []alternative {
	if req.Exactly != nil {
		return []alternative{{name: req.Name, class: req.Exactly.DeviceClassName, selectors: req.Exactly.Selectors}}
	}
	out := make([]alternative, 0, len(req.FirstAvailable))
	for _, sub := range req.FirstAvailable {
		out = append(out, alternative{name: req.Name + "/" + sub.Name, class: sub.DeviceClassName, selectors: sub.Selectors})
	}
	return out
}

// verdict returns the first alternative the device satisfies, or why the
// last one, the least demanding in a generated list, rejects it.
func verdict(ctx context.Context, compiler *cel.Cache, classes map[string]*resourceapi.DeviceClass, alts []alternative, device cel.Device) (string, string) {
	if len(alts) == 0 {
		return "", "rejected: request has no alternatives"
	}
	var reason string
	for _, alt := range alts {
		reason = rejection(ctx, compiler, classes, alt, device)
		if reason == "" {
			return alt.name, "matches " + alt.name
		}
	}
	if len(alts) > 1 {
		reason = alts[len(alts)-1].name + ": " + reason
	}
	return "", "rejected: " + reason
}

// rejection returns the first selector of alt (class selectors first, as
// the scheduler evaluates them) that the device fails, or "". Of a selector
// that joins catalogue entries it names the first entry the device fails:
// "memory >= 39Gi" says more than the whole conjunction.
func rejection(ctx context.Context, compiler *cel.Cache, classes map[string]*resourceapi.DeviceClass, alt alternative, device cel.Device) string {
	class, ok := classes[alt.class]
	if !ok {
		return fmt.Sprintf("device class %q not found", alt.class)
	}
	check := func(selectors []resourceapi.DeviceSelector, prefix string) string {
		var exprs []string
		for _, s := range selectors {
			if s.CEL == nil {
				continue
			}
			if parts, ok := rewrite.Conjuncts(s.CEL.Expression); ok {
				exprs = append(exprs, parts...)
				continue
			}
			exprs = append(exprs, s.CEL.Expression)
		}
		for _, expr := range exprs {
			r := compiler.GetOrCompile(expr)
			if r.Error != nil {
				return fmt.Sprintf("%s%s: compile error: %s", prefix, expr, r.Error.Detail)
			}
			match, _, err := r.DeviceMatches(ctx, device)
			switch {
			case err != nil:
				return fmt.Sprintf("%s%s: %v", prefix, expr, err)
			case !match:
				return prefix + expr
			}
		}
		return ""
	}
	if reason := check(class.Spec.Selectors, "class "+class.Name+": "); reason != "" {
		return reason
	}
	return check(alt.selectors, "")
}

func stringAttribute(d resourceapi.Device, driver string, name gpuv1alpha1.AttributeName) string {
	for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(driver + "/" + string(name))} {
		if a, ok := d.Attributes[key]; ok && a.StringValue != nil {
			return *a.StringValue
		}
	}
	return ""
}

func parent(request string) string {
	p, _, _ := strings.Cut(request, "/")
	return p
}
