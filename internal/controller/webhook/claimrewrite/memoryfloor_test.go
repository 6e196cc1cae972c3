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
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestMemoryFloorProbe: shares and the capacity forms are decided only
// once the API server has shown, on a dry-run claim, that it keeps
// capacity requests (an API server without DRAConsumableCapacity drops
// them silently); the forms then follow --memory-floor, and the decision
// says why.
func TestMemoryFloorProbe(t *testing.T) {
	for _, tc := range []struct {
		name string
		form rewrite.Form
		// dropsCapacity is the API server's answer to the dry-run create;
		// failures is how many calls fail first.
		dropsCapacity bool
		failures      int
		want          rewrite.Capacity
	}{
		{"the API server keeps capacity requests", rewrite.FormCapacity, false, 0,
			rewrite.Capacity{Shares: true, MemoryFloor: true, TierBounds: true, Why: "the API server keeps capacity requests, and --memory-floor=capacity"}},
		{"the CEL forms asked for", rewrite.FormCEL, false, 0,
			rewrite.Capacity{Shares: true, Why: "the API server keeps capacity requests, and --memory-floor=cel"}},
		{"the API server drops them (gate off)", rewrite.FormCapacity, true, 0,
			rewrite.Capacity{Why: "the API server drops capacity requests (DRAConsumableCapacity is off)"}},
		{"answers after two failures (webhooks not served yet)", rewrite.FormCapacity, false, 2,
			rewrite.Capacity{Shares: true, MemoryFloor: true, TierBounds: true, Why: "the API server keeps capacity requests, and --memory-floor=capacity"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset()
			calls := 0
			cs.PrependReactor("create", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
				calls++
				create := a.(k8stesting.CreateActionImpl)
				if len(create.CreateOptions.DryRun) != 1 {
					t.Errorf("probe create without dry run: %+v", create.CreateOptions)
				}
				if calls <= tc.failures {
					return true, nil, errors.New("connection refused")
				}
				claim := create.Object.(*resourceapi.ResourceClaim).DeepCopy()
				if tc.dropsCapacity {
					claim.Spec.Devices.Requests[0].Exactly.Capacity = nil
				}
				return true, claim, nil
			})
			p := &MemoryFloorProbe{Client: cs, Namespace: "prism", Form: tc.form, Interval: time.Millisecond}
			if diff := cmp.Diff(unanswered, p.Capacity()); diff != "" {
				t.Fatalf("decision before any answer (-want +got):\n%s", diff)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			p.Run(ctx)
			if ctx.Err() != nil {
				t.Fatal("probe never finished")
			}
			if calls != tc.failures+1 {
				t.Errorf("%d calls, want %d", calls, tc.failures+1)
			}
			if diff := cmp.Diff(tc.want, p.Capacity()); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}

// h100AndL40S is a fleet where a memory-bound job of 20Gi has a
// bandwidth tier (the H100) above the fits tier.
func h100AndL40S() *rewrite.Fleet {
	return &rewrite.Fleet{Models: []rewrite.Model{
		{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20},
		{Name: "NVIDIA L40S", Devices: 8, BandwidthGBps: 864, FP32GFLOPS: 91600, MemoryBytes: 45 << 30},
	}}
}

// streamRewriter is a rewriter for a memory-bound profile of 20Gi on fleet,
// with the capacity switches given in o.
func streamRewriter(t *testing.T, fleet *rewrite.Fleet, o Options) (http.Handler, *Metrics) {
	t.Helper()
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	peak := resource.MustParse("20Gi")
	stream := webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
		wp.Status.PeakMemory = &peak
	})
	o.Profiles, o.Policy, o.Recorder, o.Metrics = fakeReader(t, stream), prismv1alpha1.PolicyPerformance, record.NewFakeRecorder(10), m
	o.Fleet = func() *rewrite.Fleet { return fleet }
	h, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return h, m
}

// TestRewriterWritesTheMemoryFloorAsAsked: the rewriter asks for the
// capacity floor while the capacity decision says so, and counts the form each
// floor took.
func TestRewriterWritesTheMemoryFloorAsAsked(t *testing.T) {
	fleet := h100AndL40S()
	capacity := false
	h, m := streamRewriter(t, fleet, Options{Capacity: func() rewrite.Capacity { return rewrite.Capacity{MemoryFloor: capacity, TierBounds: capacity} }})
	object := webhooktest.ReadFixture(t, "claim-profiled.json")
	request := func(shared int) (memory string, hasCEL bool) {
		fleet.Models[1].SharedDevices = shared
		claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
		fits := claim.Spec.Devices.Requests[0].FirstAvailable[1]
		if fits.Capacity != nil {
			q := fits.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]
			memory = q.String()
		}
		for _, s := range fits.Selectors {
			hasCEL = hasCEL || strings.Contains(s.CEL.Expression, "capacity")
		}
		return memory, hasCEL
	}

	if mem, cel := request(0); mem != "" || !cel {
		t.Errorf("before the probe answered: memory request %q, CEL floor %v; want none and CEL", mem, cel)
	}
	capacity = true
	if mem, cel := request(0); mem != "39Gi" || cel {
		t.Errorf("capacity floor: memory request %q, CEL floor %v; want 39Gi and no CEL", mem, cel)
	}
	if mem, cel := request(8); mem != "" || !cel {
		t.Errorf("fleet with shareable GPUs: memory request %q, CEL floor %v; want none and CEL", mem, cel)
	}
	for form, want := range map[rewrite.Form]float64{rewrite.FormCapacity: 1, rewrite.FormCEL: 1} {
		if got := testutil.ToFloat64(m.memoryFloor.WithLabelValues(string(form))); got != want {
			t.Errorf("prism_webhook_memory_floor_total{form=%q} = %v, want %v", form, got, want)
		}
	}
}

// TestRewriterWritesTierBoundsWithTheFloor: the rewriter writes the tier
// bound as a capacity request, with the uuid guard, while the capacity
// decision says so and the fleet publishes its figures as capacities, and counts the
// form each claim's bounds took.
func TestRewriterWritesTierBoundsWithTheFloor(t *testing.T) {
	fleet := h100AndL40S()
	fleet.Models[0].FigureCapacityDevices = 8
	capacity := false
	h, m := streamRewriter(t, fleet, Options{Capacity: func() rewrite.Capacity { return rewrite.Capacity{MemoryFloor: capacity, TierBounds: capacity} }})
	object := webhooktest.ReadFixture(t, "claim-profiled.json")
	// request says whether the top tier compares bandwidth as a capacity,
	// and whether the claim carries the guard.
	request := func(withoutFigures int) (capacityBound, guarded bool) {
		fleet.Models[1].FigureCapacityDevices = 8 - withoutFigures
		claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
		top := claim.Spec.Devices.Requests[0].FirstAvailable[0]
		if top.Capacity != nil {
			_, capacityBound = top.Capacity.Requests[gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified()]
		}
		for _, c := range claim.Spec.Devices.Constraints {
			guarded = guarded || c.MatchAttribute != nil && *c.MatchAttribute == rewrite.GuardAttribute
		}
		return capacityBound, guarded
	}

	if b, g := request(0); b || g {
		t.Errorf("before the probe answered: capacity bound %v, guard %v; want neither", b, g)
	}
	capacity = true
	if b, g := request(0); !b || !g {
		t.Errorf("capacity forms: capacity bound %v, guard %v; want both", b, g)
	}
	if b, g := request(3); b || g {
		t.Errorf("3 GPUs without figure capacities: capacity bound %v, guard %v; want neither", b, g)
	}
	for form, want := range map[rewrite.Form]float64{rewrite.FormCapacity: 1, rewrite.FormCEL: 1} {
		if got := testutil.ToFloat64(m.bounds.WithLabelValues(string(form))); got != want {
			t.Errorf("prism_webhook_tier_bounds_total{form=%q} = %v, want %v", form, got, want)
		}
	}
}

// TestPlanNamesTheCapacityDecision: the plan says which form the controller
// asked for and why, as the probe decided it, and names no decision where
// nobody made one.
func TestPlanNamesTheCapacityDecision(t *testing.T) {
	for _, tc := range []struct {
		name     string
		capacity func() rewrite.Capacity
		want     string
	}{
		{"capacity forms", func() rewrite.Capacity { return decideCapacity(rewrite.FormCapacity, true) },
			"capacity: the API server keeps capacity requests, and --memory-floor=capacity"},
		{"the CEL forms asked for", func() rewrite.Capacity { return decideCapacity(rewrite.FormCEL, true) },
			"cel: the API server keeps capacity requests, and --memory-floor=cel"},
		{"capacity requests dropped", func() rewrite.Capacity { return decideCapacity(rewrite.FormCapacity, false) },
			"cel: the API server drops capacity requests (DRAConsumableCapacity is off)"},
		{"nowhere to probe", Unprobed, "cel: no --namespace to probe the API server in with a dry-run claim"},
		{"no decision", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, _ := streamRewriter(t, h100AndL40S(), Options{Capacity: tc.capacity})
			object := webhooktest.ReadFixture(t, "claim-profiled.json")
			claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
			var plan rewrite.Plan
			if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
				t.Fatalf("rewrite annotation: %v", err)
			}
			if diff := cmp.Diff(tc.want, plan.Capacity.String()); diff != "" {
				t.Errorf("plan's capacity (-want +got):\n%s", diff)
			}
		})
	}
}
