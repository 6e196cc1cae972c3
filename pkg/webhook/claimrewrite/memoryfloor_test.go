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
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

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
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/pkg/webhook/webhooktest"
)

// TestMemoryFloorProbe: the capacity request is used only once the API
// server has shown, on a dry-run claim, that it keeps capacity requests;
// an API server without DRAConsumableCapacity drops them silently.
func TestMemoryFloorProbe(t *testing.T) {
	for _, tc := range []struct {
		name string
		// apiServer answers the dry-run create; failures is how many
		// calls fail first.
		dropsCapacity bool
		failures      int
		want          bool
	}{
		{"the API server keeps capacity requests", false, 0, true},
		{"the API server drops them (gate off)", true, 0, false},
		{"answers after two failures (webhooks not served yet)", false, 2, true},
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
			p := &MemoryFloorProbe{Client: cs, Namespace: "prism", Interval: time.Millisecond}
			if p.Capacity() {
				t.Fatal("capacity before any answer")
			}
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			p.Run(ctx)
			if ctx.Err() != nil {
				t.Fatal("probe never finished")
			}
			if p.Capacity() != tc.want || calls != tc.failures+1 {
				t.Errorf("capacity %v after %d calls, want %v after %d", p.Capacity(), calls, tc.want, tc.failures+1)
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
// capacity floor while CapacityForms says yes, and counts the form each
// floor took.
func TestRewriterWritesTheMemoryFloorAsAsked(t *testing.T) {
	fleet := h100AndL40S()
	capacity := false
	h, m := streamRewriter(t, fleet, Options{CapacityForms: func() bool { return capacity }})
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
// bound as a capacity request, with the uuid guard, while CapacityForms says
// yes and the fleet publishes its figures as capacities, and counts the
// form each claim's bounds took.
func TestRewriterWritesTierBoundsWithTheFloor(t *testing.T) {
	fleet := h100AndL40S()
	fleet.Models[0].FigureCapacityDevices = 8
	capacity := false
	h, m := streamRewriter(t, fleet, Options{CapacityForms: func() bool { return capacity }})
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
