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
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

const userSelector = `device.attributes["gpu.prism.dev"].migCapable == false || device.attributes["gpu.prism.dev"].numaNode == 0`

func sel(expr string) resourceapi.DeviceSelector {
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: expr}}
}

func mem(gi int64) string { return memoryAtLeast(gi) }

// richGPURequest carries every field that must survive the rewrite.
func richGPURequest() resourceapi.DeviceRequest {
	r := exactGPU("gpu", 2, userSelector)
	r.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: "maintenance", Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": *qty("1Gi")}}
	return r
}

func TestRewriteLadders(t *testing.T) {
	cc80 := ccAtLeast(8, 0)
	for name, tc := range map[string]struct {
		profile Profile
		tiers   []string
		first   []string // generated selector of each tier before the hard needs
		needs   []string
	}{
		"memory-bound performance": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("16Gi"), MinComputeCapability: "8.0"},
			tiers:   []string{"ultra", "high", "fits"},
			first:   []string{bandwidthIs("ultra"), bandwidthIs("high"), ""},
			needs:   []string{mem(22), cc80},
		},
		"memory-bound economy": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: qty("30Gi")},
			tiers:   []string{"high", "fits"},
			first:   []string{bandwidthIs("high"), ""},
			needs:   []string{mem(39)},
		},
		"compute-bound performance, default policy": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, MinMemory: qty("40Gi")},
			tiers:   []string{"fp32-fast", "fits"},
			first:   []string{fp32AtLeast(60000), ""},
			needs:   []string{mem(44)},
		},
		"compute-bound economy": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, MinComputeCapability: "8.1"},
			tiers:   []string{"fp32-value", "fits"},
			first:   []string{catalogue[selFP32Value], ""},
			needs:   []string{ccAtLeast(8, 6)},
		},
		"latency-bound performance": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyPerformance, PeakMemory: qty("4Gi")},
			tiers:   []string{"fp32-fast", "fits"},
			first:   []string{fp32AtLeast(60000), ""},
			needs:   []string{mem(7)},
		},
		"latency-bound economy without hard needs": {
			profile: Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy},
			tiers:   []string{"low", "fits"},
			first:   []string{bandwidthIs("low"), ""},
		},
	} {
		t.Run(name, func(t *testing.T) {
			in := gpuSpec(richGPURequest())
			out, plan, err := Rewrite(context.Background(), in, tc.profile)
			if err != nil {
				t.Fatal(err)
			}
			orig := richGPURequest()
			req := out.Devices.Requests[0]
			if req.Exactly != nil || req.Name != "gpu" {
				t.Fatalf("request not converted: %+v", req)
			}
			if got := subNames(req); !equalStrings(got, tc.tiers) {
				t.Fatalf("tiers %v, want %v", got, tc.tiers)
			}
			if plan.Rewritten[0] != "gpu" || len(plan.Alternatives) != len(tc.tiers) {
				t.Errorf("plan %+v", plan)
			}
			for i, sub := range req.FirstAvailable {
				var want []string
				if tc.first[i] != "" {
					want = append(want, tc.first[i])
				}
				want = append(want, tc.needs...)
				want = append(want, userSelector)
				if got := exprs(sub.Selectors); !equalStrings(got, want) {
					t.Errorf("tier %s selectors\n got %q\nwant %q", sub.Name, got, want)
				}
				wantSelectors := 1 // the user's
				if len(want) > 1 {
					wantSelectors = 2 // the generated tests, joined in one, first
				}
				if len(sub.Selectors) != wantSelectors {
					t.Errorf("tier %s: %d selectors, want %d", sub.Name, len(sub.Selectors), wantSelectors)
				}
				// A generated (guarded) selector first keeps foreign devices
				// out, so the class needs no selector of its own.
				wantClass := DeviceClassName
				if len(want) > 1 {
					wantClass = TierDeviceClassName
				}
				if sub.Count != orig.Exactly.Count || sub.AllocationMode != orig.Exactly.AllocationMode || sub.DeviceClassName != wantClass {
					t.Errorf("tier %s lost count/mode/class: %+v", sub.Name, sub)
				}
				if !apiequality.Semantic.DeepEqual(sub.Tolerations, orig.Exactly.Tolerations) || !apiequality.Semantic.DeepEqual(sub.Capacity, orig.Exactly.Capacity) {
					t.Errorf("tier %s lost tolerations or capacity", sub.Name)
				}
			}
			if !apiequality.Semantic.DeepEqual(in, gpuSpec(richGPURequest())) {
				t.Error("input was modified")
			}
		})
	}
}

func TestRewriteLeavesAlone(t *testing.T) {
	profile := Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("10Gi")}
	existing := resourceapi.DeviceRequest{Name: "pref"}
	for i := range resourceapi.FirstAvailableDeviceRequestMaxSize {
		existing.FirstAvailable = append(existing.FirstAvailable, resourceapi.DeviceSubRequest{Name: fmt.Sprintf("s%d", i), DeviceClassName: DeviceClassName})
	}
	admin := exactGPU("admin", 1)
	admin.Exactly.AdminAccess = ptr.To(true)
	all := exactGPU("all", 0)
	all.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	nic := exactGPU("nic", 1)
	nic.Exactly.DeviceClassName = "nic.example.com"
	crowded := exactGPU("crowded", 1)
	for range resourceapi.DeviceSelectorsMaxSize {
		crowded.Exactly.Selectors = append(crowded.Exactly.Selectors, sel(userSelector))
	}
	for name, tc := range map[string]struct {
		profile Profile
		req     resourceapi.DeviceRequest
		reason  string
	}{
		"balanced":             {Profile{BoundType: prismv1alpha1.BoundTypeBalanced}, exactGPU("gpu", 1), "Balanced"},
		"unknown":              {Profile{BoundType: prismv1alpha1.BoundTypeUnknown, PeakMemory: qty("1Gi")}, exactGPU("gpu", 1), "Unknown"},
		"empty bound type":     {Profile{}, exactGPU("gpu", 1), "Unknown"},
		"other class":          {profile, nic, "not gpu.prism.dev"},
		"existing list of 8":   {profile, existing, "firstAvailable"},
		"admin access":         {profile, admin, "adminAccess"},
		"allocation mode all":  {profile, all, "All"},
		"too many selectors":   {profile, crowded, "take all 32 places"},
		"no request type":      {profile, resourceapi.DeviceRequest{Name: "empty"}, "no exactly"},
		"balanced ignores bad": {Profile{BoundType: prismv1alpha1.BoundTypeBalanced, PeakMemory: qty("1Ei")}, exactGPU("gpu", 1), "Balanced"},
	} {
		t.Run(name, func(t *testing.T) {
			in := gpuSpec(tc.req)
			out, plan, err := Rewrite(context.Background(), in, tc.profile)
			if err != nil {
				t.Fatal(err)
			}
			if !apiequality.Semantic.DeepEqual(out, in) {
				t.Errorf("request changed:\n%+v", out.Devices.Requests[0])
			}
			if len(plan.Rewritten) != 0 || len(plan.Untouched) != 1 || !strings.Contains(plan.Untouched[0].Reason, tc.reason) {
				t.Errorf("plan %+v, want one untouched request with reason containing %q", plan, tc.reason)
			}
		})
	}
}

func TestRewriteMixedClaim(t *testing.T) {
	nic := exactGPU("nic", 1, `device.driver == "nic.example.com"`)
	nic.Exactly.DeviceClassName = "nic.example.com"
	in := gpuSpec(nic, exactGPU("gpu", 1))
	in.Devices.Constraints = []resourceapi.DeviceConstraint{{Requests: []string{"gpu", "nic"}, MatchAttribute: ptr.To(resourceapi.FullyQualifiedName("example.com/pcieRoot"))}}
	out, plan, err := Rewrite(context.Background(), in, Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("10Gi")})
	if err != nil {
		t.Fatal(err)
	}
	if !apiequality.Semantic.DeepEqual(out.Devices.Requests[0], in.Devices.Requests[0]) {
		t.Error("NIC request changed")
	}
	if len(out.Devices.Requests[1].FirstAvailable) != 3 {
		t.Errorf("GPU request not rewritten: %+v", out.Devices.Requests[1])
	}
	// The parent name is kept, so constraints and configs still refer to it.
	if !apiequality.Semantic.DeepEqual(out.Devices.Constraints, in.Devices.Constraints) {
		t.Error("constraints changed")
	}
	if !equalStrings(plan.Rewritten, []string{"gpu"}) || len(plan.Untouched) != 1 || plan.Untouched[0].Request != "nic" {
		t.Errorf("plan %+v", plan)
	}
	// Rewriting the result again must not stack tiers.
	again, _, err := Rewrite(context.Background(), out, Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("10Gi")})
	if err != nil || !apiequality.Semantic.DeepEqual(again, out) {
		t.Errorf("rewrite is not idempotent (err %v)", err)
	}
}

func TestRewriteWithoutGPURequestIsByteIdentical(t *testing.T) {
	data := readFixture(t, "claim-no-gpu.json")
	var in resourceapi.ResourceClaimSpec
	if err := json.Unmarshal(data, &in); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(&in)
	for _, p := range []Profile{{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("10Gi")}, {BoundType: prismv1alpha1.BoundTypeBalanced}} {
		out, plan, err := Rewrite(context.Background(), &in, p)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := json.Marshal(out)
		if string(got) != string(want) {
			t.Errorf("%s: output differs:\n got %s\nwant %s", p.BoundType, got, want)
		}
		if len(plan.Rewritten) != 0 || len(plan.Untouched) != len(in.Devices.Requests) {
			t.Errorf("%s: plan %+v", p.BoundType, plan)
		}
	}
}

func TestHardNeeds(t *testing.T) {
	for name, tc := range map[string]struct {
		profile Profile
		want    string
		err     bool
	}{
		"20 GB footprint skips the 24 GB class":  {profile: Profile{PeakMemory: qty("20G")}, want: "memory>=39Gi"},
		"20 GiB footprint skips the 24 GB class": {profile: Profile{PeakMemory: qty("20Gi")}, want: "memory>=39Gi"},
		"16 GiB footprint fits the 24 GB class":  {profile: Profile{PeakMemory: qty("16Gi")}, want: "memory>=22Gi"},
		"min wins over small peak":               {profile: Profile{PeakMemory: qty("1Gi"), MinMemory: qty("40Gi")}, want: "memory>=44Gi"},
		"min exactly on a floor":                 {profile: Profile{MinMemory: qty("79Gi")}, want: "memory>=79Gi"},
		"zero means none":                        {profile: Profile{PeakMemory: qty("0")}, want: ""},
		"cc rounds up":                           {profile: Profile{MinComputeCapability: "8.7"}, want: "cc>=8.9"},
		"old cc":                                 {profile: Profile{MinComputeCapability: "6.1", MinMemory: qty("1")}, want: "memory>=7Gi cc>=7.5"},
		"cc too new":                             {profile: Profile{MinComputeCapability: "12.0"}, err: true},
		"cc not a version":                       {profile: Profile{MinComputeCapability: `8.0") || true || ("`}, err: true},
		"negative":                               {profile: Profile{PeakMemory: qty("-1Gi")}, err: true},
		"larger than any GPU":                    {profile: Profile{MinMemory: qty("200Gi")}, err: true},
		"absurd":                                 {profile: Profile{PeakMemory: qty("9Ei")}, err: true},
	} {
		t.Run(name, func(t *testing.T) {
			n, err := tc.profile.needs()
			if tc.err {
				if !errors.Is(err, ErrInvalidProfile) {
					t.Fatalf("got %v, want ErrInvalidProfile", err)
				}
				return
			}
			if err != nil || n.text != tc.want {
				t.Fatalf("got %q, %v; want %q", n.text, err, tc.want)
			}
		})
	}
}

func TestRewriteErrors(t *testing.T) {
	for name, p := range map[string]Profile{
		"policy":     {BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: "fastest"},
		"bound type": {BoundType: "memorybound"},
		"memory":     {BoundType: prismv1alpha1.BoundTypeLatencyBound, MinMemory: qty("1Pi")},
	} {
		t.Run(name, func(t *testing.T) {
			out, plan, err := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), p)
			if !errors.Is(err, ErrInvalidProfile) || out != nil || plan != nil {
				t.Errorf("got %v, %v, %v; want only ErrInvalidProfile", out, plan, err)
			}
		})
	}
	if _, _, err := Rewrite(context.Background(), nil, Profile{}); err == nil {
		t.Error("nil spec accepted")
	}
}

func TestAnnotation(t *testing.T) {
	var reqs []resourceapi.DeviceRequest
	for i := range resourceapi.DeviceRequestsMaxSize {
		r := exactGPU(fmt.Sprintf("%s-%02d", strings.Repeat("r", 60), i), 1)
		if i%2 == 1 {
			r.Exactly.DeviceClassName = "other.example.com"
		}
		reqs = append(reqs, r)
	}
	_, plan, err := Rewrite(context.Background(), gpuSpec(reqs...), Profile{
		Name: "ü" + strings.Repeat("\x01\"", 200), BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: qty("10Gi"), MinComputeCapability: "8.0",
	})
	if err != nil {
		t.Fatal(err)
	}
	s, err := plan.Annotation()
	if err != nil {
		t.Fatal(err)
	}
	var back Plan
	if err := json.Unmarshal([]byte(s), &back); err != nil {
		t.Fatalf("annotation is not JSON: %v", err)
	}
	if len(s) > MaxAnnotationSize || !back.Truncated || back.HardNeeds != "memory>=15Gi cc>=8.0" || len(back.Alternatives) != 3 {
		t.Errorf("annotation %d bytes, truncated %v: %s", len(s), back.Truncated, s)
	}

	_, small, _ := Rewrite(context.Background(), gpuSpec(exactGPU("gpu", 1)), Profile{Name: "llm", BoundType: prismv1alpha1.BoundTypeLatencyBound})
	s, err = small.Annotation()
	want := `{"profile":"llm","boundType":"LatencyBound","policy":"performance","alternatives":[{"name":"fp32-fast","reason":"fp32 >= 60 TFLOPS: L40S, RTX 4090, H100, H200"},{"name":"fits","reason":"hard needs only: never less schedulable than the plain claim"}],"rewritten":["gpu"]}`
	if err != nil || s != want {
		t.Errorf("got %s, %v\nwant %s", s, err, want)
	}
}

func TestCatalogueCompiles(t *testing.T) {
	seen := map[string]bool{}
	for i, expr := range Catalogue() {
		if seen[expr] {
			t.Errorf("duplicate entry %q", expr)
		}
		seen[expr] = true
		if _, err := verifiedSelector(selectorID(i)); err != nil {
			t.Error(err)
		}
	}
	// The threshold grid is bounded separately: one fleet uses a few of
	// its entries (TestFleetSelectorsBounded). So are the MIG profiles: a
	// fleet publishes those of its few MIG models only.
	if n := len(seen) - len(thresholdExpressions()) - len(migProfileNames); n > 20 {
		t.Errorf("catalogue has %d entries outside the threshold grid; kube-scheduler caches 10 programs", n)
	}
	c := Catalogue()
	c[0] = "mutated"
	if Catalogue()[0] == "mutated" {
		t.Error("Catalogue exposes its backing array")
	}
}

func subNames(r resourceapi.DeviceRequest) []string {
	var out []string
	for _, s := range r.FirstAvailable {
		out = append(out, s.Name)
	}
	return out
}

// exprs lists the tests of sels, a joined generated selector as the
// catalogue entries it joins.
func exprs(sels []resourceapi.DeviceSelector) []string {
	var out []string
	for _, s := range sels {
		if parts, ok := Conjuncts(s.CEL.Expression); ok {
			out = append(out, parts...)
			continue
		}
		out = append(out, s.CEL.Expression)
	}
	return out
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00") && len(a) == len(b)
}

func equalSpecs(a, b *resourceapi.ResourceClaimSpec) bool {
	return apiequality.Semantic.DeepEqual(a, b)
}

func TestShareMemoryRequestsTheFootprint(t *testing.T) {
	peak := resource.MustParse("20Gi")
	userAmount := resource.MustParse("30Gi")
	for _, tc := range []struct {
		name      string
		share     bool
		userAsks  *resource.Quantity
		wantShare string // "" means no capacity request
	}{
		{"sharing asks for peak plus headroom (20Gi + 10 % + 2Gi) in whole GiB", true, nil, "24Gi"},
		{"a user's own amount is kept", true, &userAmount, "30Gi"},
		{"without sharing the whole GPU is asked for", false, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
			}}}}
			if tc.userAsks != nil {
				spec.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{gpuv1alpha1.MemoryCapacity.Qualified(): *tc.userAsks}}
			}
			out, _, err := Rewrite(context.Background(), spec, Profile{Name: "train", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: &peak, ShareMemory: tc.share})
			if err != nil {
				t.Fatal(err)
			}
			subs := out.Devices.Requests[0].FirstAvailable
			if len(subs) == 0 {
				t.Fatal("request not rewritten")
			}
			for _, sub := range subs {
				var got string
				if sub.Capacity != nil {
					if q, ok := sub.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]; ok {
						got = q.String()
					}
				}
				if got != tc.wantShare {
					t.Errorf("subrequest %s asks for memory %q, want %q", sub.Name, got, tc.wantShare)
				}
			}
		})
	}
}
