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
	"context"
	"math/rand/v2"
	"regexp"
	"strconv"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/cel"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// hostile are strings a profile or a user might carry that would change the
// meaning of an expression if they were ever spliced into CEL.
var hostile = []string{
	"", "8.0", "9.0", "8.0\") || true || (\"", "device.driver", ")", "||", "\n", "ünïcödé", "MemoryBound",
	"ComputeBound", "LatencyBound", "Balanced", "performance", "economy", "1Ei", "-5Gi", "20Gi", "999999999999999999999",
	"0.5", "80Gi", "16G", `"`, "${x}", "8.0.0", "10.0", "12.0",
}

var boundTypes = []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound, prismv1alpha1.BoundTypeBalanced, prismv1alpha1.BoundTypeUnknown, "", "memory||bound"}
var policies = []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy, "", "econ\"omy"}

var (
	quantityPattern = regexp.MustCompile(prismv1alpha1.QuantityPattern)
	// fewDigitsExponent are strings that ParseQuantity reads as an int64
	// times a power of ten at once, however large the exponent: at most
	// 18 digits and no fraction.
	fewDigitsExponent = regexp.MustCompile(`^[+-]?[0-9]{0,18}[eE]\+?([0-9]+)$`)
)

// parseQuantity parses s the way a decoder would, except where
// ParseQuantity itself does unbounded work (a large negative exponent, or
// more digits and a large exponent; kubernetes/kubernetes#141306): no
// profile carries those, because the CRD's QuantityPattern keeps them out
// of the API. A large positive exponent on few digits parses at once, and
// stays in: comparing what it parses to is issue 31's hang.
func parseQuantity(s string) *resource.Quantity {
	if m := fewDigitsExponent.FindStringSubmatch(s); m != nil {
		if _, err := strconv.ParseInt(m[1], 10, 32); err != nil {
			return nil // older ParseQuantity wraps such exponents around
		}
	} else if !quantityPattern.MatchString(s) {
		return nil
	}
	q, err := resource.ParseQuantity(s)
	if err != nil {
		return nil
	}
	return &q
}

// randomSpec builds a claim from rnd, with user selectors taken from user.
func randomSpec(rnd *rand.Rand, user string) *resourceapi.ResourceClaimSpec {
	spec := &resourceapi.ResourceClaimSpec{}
	for i := range 1 + rnd.IntN(4) {
		name := string(rune('a' + i))
		var sels []resourceapi.DeviceSelector
		for range rnd.IntN(3) {
			sels = append(sels, sel(user))
		}
		class := DeviceClassName
		if rnd.IntN(4) == 0 {
			class = "nic.example.com"
		}
		switch rnd.IntN(6) {
		case 0:
			r := resourceapi.DeviceRequest{Name: name}
			for j := range 1 + rnd.IntN(resourceapi.FirstAvailableDeviceRequestMaxSize) {
				r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: string(rune('a' + j)), DeviceClassName: class, Selectors: sels})
			}
			spec.Devices.Requests = append(spec.Devices.Requests, r)
		default:
			r := exactGPU(name, rnd.Int64N(9))
			r.Exactly.DeviceClassName = class
			r.Exactly.Selectors = sels
			if rnd.IntN(8) == 0 {
				r.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
			}
			spec.Devices.Requests = append(spec.Devices.Requests, r)
		}
	}
	return spec
}

func randomProfile(rnd *rand.Rand, pick func() string) Profile {
	return Profile{
		Name:                 pick(),
		BoundType:            boundTypes[rnd.IntN(len(boundTypes))],
		Policy:               policies[rnd.IntN(len(policies))],
		MinMemory:            parseQuantity(pick()),
		PeakMemory:           parseQuantity(pick()),
		MinComputeCapability: pick(),
	}
}

// checkOutput fails unless each subrequest's generated tests are one
// selector, first, that joins catalogue entries and compiles within the API
// limits, user selectors come after it unchanged, and the API's list limits
// hold. It returns the generated selectors it saw, by request.
func checkOutput(t *testing.T, in, out *resourceapi.ResourceClaimSpec, plan *Plan) map[string][]string {
	t.Helper()
	if len(out.Devices.Requests) != len(in.Devices.Requests) {
		t.Fatalf("%d requests in, %d out", len(in.Devices.Requests), len(out.Devices.Requests))
	}
	compiler := cel.GetCompiler(cel.Features{})
	used := map[string][]string{}
	for i, r := range out.Devices.Requests {
		orig := in.Devices.Requests[i]
		if orig.Exactly == nil || r.Exactly != nil {
			continue // untouched, compared by the caller
		}
		if len(r.FirstAvailable) > resourceapi.FirstAvailableDeviceRequestMaxSize {
			t.Fatalf("request %s: %d subrequests", r.Name, len(r.FirstAvailable))
		}
		names := map[string]bool{}
		for _, sub := range r.FirstAvailable {
			if names[sub.Name] {
				t.Fatalf("duplicate subrequest %q", sub.Name)
			}
			names[sub.Name] = true
			if len(sub.Selectors) > resourceapi.DeviceSelectorsMaxSize {
				t.Fatalf("subrequest %s: %d selectors", sub.Name, len(sub.Selectors))
			}
			generated := len(sub.Selectors) - len(orig.Exactly.Selectors)
			if generated < 0 || generated > 1 {
				t.Fatalf("subrequest %s: %d generated selectors, want at most one", sub.Name, generated)
			}
			for j, s := range sub.Selectors {
				if j >= generated {
					if s.CEL.Expression != orig.Exactly.Selectors[j-generated].CEL.Expression {
						t.Fatalf("user selector changed: %q", s.CEL.Expression)
					}
					continue
				}
				if _, ok := Conjuncts(s.CEL.Expression); !ok {
					t.Fatalf("generated selector joins something outside the catalogue: %q", s.CEL.Expression)
				}
				if err := checkExpression(compiler.CompileCELExpression(s.CEL.Expression, cel.Options{})); err != nil {
					t.Fatal(err)
				}
				used[r.Name] = append(used[r.Name], s.CEL.Expression)
			}
		}
	}
	if a, err := plan.Annotation(); err != nil || len(a) > MaxAnnotationSize {
		t.Fatalf("annotation %d bytes, %v", len(a), err)
	}
	return used
}

func FuzzRewrite(f *testing.F) {
	f.Add(uint64(1), "20Gi", "8.0", "llm", device(`.driver == "x"`))
	f.Add(uint64(2), "1Ei", "8.0\") || true", "ü\n)", "||")
	f.Add(uint64(3), "-1", "10.0", "", ")")
	// Issue 31: CmpInt64 on zero times 10^1111011110 ran for minutes.
	f.Add(uint64(97), "E1111011110", "0", "0", "0")
	f.Add(uint64(97), "1E1111011110", "0", "0", "0")
	f.Fuzz(func(t *testing.T, seed uint64, memory, cc, name, user string) {
		rnd := rand.New(rand.NewPCG(seed, seed>>7))
		pick := func() string {
			switch rnd.IntN(4) {
			case 0:
				return memory
			case 1:
				return cc
			case 2:
				return name
			}
			return hostile[rnd.IntN(len(hostile))]
		}
		in := randomSpec(rnd, user)
		before := in.DeepCopy()
		profile := randomProfile(rnd, pick)
		profile.ShareMemory = rnd.IntN(2) == 0
		out, plan, err := Rewrite(context.Background(), in, profile)
		if err != nil {
			return
		}
		checkOutput(t, in, out, plan)
		if !equalSpecs(in, before) {
			t.Fatal("input modified")
		}
		checkMemoryBounds(t, profile, plan, out)
	})
}

// checkMemoryBounds fails unless a rewrite that weighed the profile's
// memory figures had figures within [0, MaxDeviceMemory], and asks for no
// more memory than the largest bucket. The figures are judged by floating
// point, not by BoundedValue, so that the two check each other.
func checkMemoryBounds(t *testing.T, p Profile, plan *Plan, out *resourceapi.ResourceClaimSpec) {
	t.Helper()
	if plan.BoundType == prismv1alpha1.BoundTypeBalanced || plan.BoundType == prismv1alpha1.BoundTypeUnknown {
		return // no hard needs computed
	}
	for _, q := range []*resource.Quantity{p.MinMemory, p.PeakMemory} {
		if q == nil || q.Sign() == 0 {
			continue
		}
		if f := q.AsApproximateFloat64(); !(f > 0 && f <= float64(prismv1alpha1.MaxDeviceMemory)*(1+1e-9)) {
			t.Fatalf("profile memory %s (about %g) is outside [0, %d], yet Rewrite succeeded", q.String(), f, prismv1alpha1.MaxDeviceMemory)
		}
	}
	largest := memoryFloorsGi[len(memoryFloorsGi)-1] << 30
	for _, r := range out.Devices.Requests {
		for _, sub := range r.FirstAvailable {
			if sub.Capacity == nil {
				continue
			}
			if amount, ok := sub.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]; ok && amount.Value() > largest {
				t.Fatalf("subrequest %s/%s asks for %s of memory, more than the largest bucket", r.Name, sub.Name, amount.String())
			}
		}
	}
}

func device(s string) string { return "device" + s }

// TestDistinctSelectors runs mixed random claims and profiles and counts the
// selector strings that reach kube-scheduler's 10-entry CEL cache. What
// must fit it is one pod's: the allocator evaluates a claim's programs on
// every node it filters, so a request may bring no more programs than it
// has tiers. Across profiles the joined strings vary with the needs; the
// entries they join must stay the catalogue's few.
func TestDistinctSelectors(t *testing.T) {
	rnd := rand.New(rand.NewPCG(42, 7))
	pick := func() string { return hostile[rnd.IntN(len(hostile))] }
	joinedStrings, entries := map[string]bool{}, map[string]bool{}
	rewritten := 0
	for range 1000 {
		p := randomProfile(rnd, pick)
		// Mostly sane profiles, so that most iterations emit something.
		if rnd.IntN(3) > 0 {
			p.BoundType = []prismv1alpha1.BoundType{prismv1alpha1.BoundTypeMemoryBound, prismv1alpha1.BoundTypeComputeBound, prismv1alpha1.BoundTypeLatencyBound}[rnd.IntN(3)]
			p.Policy = []prismv1alpha1.Policy{prismv1alpha1.PolicyPerformance, prismv1alpha1.PolicyEconomy}[rnd.IntN(2)]
			p.PeakMemory = resource.NewQuantity(rnd.Int64N(150<<30), resource.BinarySI)
			p.MinComputeCapability = []string{"", "7.0", "7.5", "8.0", "8.6", "8.9", "9.0"}[rnd.IntN(7)]
		}
		in := randomSpec(rnd, `device.attributes["gpu.prism.dev"].index < 4`)
		out, plan, err := Rewrite(context.Background(), in, p)
		if err != nil {
			continue
		}
		rewritten += len(plan.Rewritten)
		for request, sels := range checkOutput(t, in, out, plan) {
			if len(sels) > len(plan.Alternatives) {
				t.Errorf("request %s brings %d generated selectors for %d tiers", request, len(sels), len(plan.Alternatives))
			}
			for _, e := range sels {
				joinedStrings[e] = true
				parts, _ := Conjuncts(e)
				for _, p := range parts {
					entries[p] = true
				}
			}
		}
	}
	t.Logf("%d requests rewritten, %d distinct generated selectors joining %d catalogue entries", rewritten, len(joinedStrings), len(entries))
	if rewritten < 500 || len(entries) > 20 {
		t.Errorf("%d requests rewritten, %d distinct catalogue entries used; want >= 500 and <= 20", rewritten, len(entries))
	}
}
