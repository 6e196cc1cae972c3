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
	"bytes"
	"cmp"
	"path/filepath"
	"strings"
	"testing"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/internal/goldentest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// memoryBoundClaim is claim.json rewritten the way the webhook does for a
// memory-bound profile with a 30Gi peak (hard need: memory >= 39Gi) and
// the given minimum compute capability ("": none).
func memoryBoundClaim(t *testing.T, minCC string) *resourceapi.ResourceClaim {
	_, ctx := ktesting.NewTestContext(t)
	claim := explaintest.Load[*resourceapi.ResourceClaim](t, "claim.json")
	peak := resource.MustParse("30Gi")
	spec, _, err := rewrite.Rewrite(ctx, &claim.Spec, rewrite.Profile{Name: "train", BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: &peak, MinComputeCapability: minCC})
	if err != nil {
		t.Fatal(err)
	}
	claim.Spec = *spec
	return claim
}

func TestExplain(t *testing.T) {
	slices := explaintest.Load[[]resourceapi.ResourceSlice](t, "slices.json")
	classes := explaintest.Load[[]resourceapi.DeviceClass](t, "classes.json")
	type key struct{ node, device string }
	tests := []struct {
		name    string
		claim   func(t *testing.T) *resourceapi.ResourceClaim
		classes []resourceapi.DeviceClass
		holders map[DeviceID][]Holder
		// want maps devices to a verdict prefix; every row must be listed.
		want          map[key]string
		wantAllocated key
		// wantHeldBy maps devices to the other claims listed as holding them.
		wantHeldBy map[key]string
	}{
		{
			name: "plain request",
			claim: func(t *testing.T) *resourceapi.ResourceClaim {
				return explaintest.Load[*resourceapi.ResourceClaim](t, "claim.json")
			},
			classes: classes,
			want: map[key]string{
				{"node-a", "gpu-0"}: "matches gpu",
				{"node-a", "gpu-1"}: "matches gpu",
				{"node-b", "gpu-0"}: `rejected: device.attributes["gpu.prism.dev"].productName != "NVIDIA L40S"`,
				{"node-b", "gpu-1"}: "matches gpu",
				// No attributes: the user's unguarded lookup is a
				// runtime error, which the scheduler also reports.
				{"node-b", "gpu-2"}: `rejected: device.attributes["gpu.prism.dev"].productName != "NVIDIA L40S": `,
				{"node-b", "eth0"}:  `rejected: class gpu.prism.dev: device.driver == "gpu.prism.dev"`,
			},
		},
		{
			name: "rewritten request with allocation",
			claim: func(t *testing.T) *resourceapi.ResourceClaim {
				c := memoryBoundClaim(t, "")
				c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu/high", Driver: "gpu.prism.dev", Pool: "node-a", Device: "gpu-1"},
				}}}
				return c
			},
			classes: classes,
			want: map[key]string{
				{"node-a", "gpu-0"}: "matches gpu/ultra",
				{"node-a", "gpu-1"}: "matches gpu/high",
				{"node-b", "gpu-0"}: `rejected: gpu/fits: device.attributes["gpu.prism.dev"].productName != "NVIDIA L40S"`,
				{"node-b", "gpu-1"}: `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
				{"node-b", "gpu-2"}: `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
				// Generated subrequests use a class without selectors: the
				// guarded memory floor keeps the NIC out.
				{"node-b", "eth0"}: `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
			},
			wantAllocated: key{"node-a", "gpu-1"},
		},
		{
			// The hard needs are one joined selector; the verdict names the
			// need the A100 fails, not the whole expression.
			name: "rewritten request with a compute-capability floor",
			claim: func(t *testing.T) *resourceapi.ResourceClaim {
				return memoryBoundClaim(t, "9.0")
			},
			classes: classes,
			want: map[key]string{
				{"node-a", "gpu-0"}: "matches gpu/ultra",
				{"node-a", "gpu-1"}: `rejected: gpu/fits: "cudaComputeCapability" in device.attributes["gpu.prism.dev"]`,
				// The L40S (8.9) fails it before the user's selector.
				{"node-b", "gpu-0"}: `rejected: gpu/fits: "cudaComputeCapability" in device.attributes["gpu.prism.dev"]`,
				{"node-b", "gpu-1"}: `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
				{"node-b", "gpu-2"}: `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
				{"node-b", "eth0"}:  `rejected: gpu/fits: "memory" in device.capacity["gpu.prism.dev"]`,
			},
		},
		{
			name: "devices held by other claims",
			claim: func(t *testing.T) *resourceapi.ResourceClaim {
				c := explaintest.Load[*resourceapi.ResourceClaim](t, "claim.json")
				c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
					{Request: "gpu", Driver: "gpu.prism.dev", Pool: "node-a", Device: "gpu-1"},
				}}}
				return c
			},
			classes: classes,
			holders: Holders(explaintest.Load[[]resourceapi.ResourceClaim](t, "claims.json")),
			want: map[key]string{
				{"node-a", "gpu-0"}: "matches gpu, but ml/other-gpu holds it",
				{"node-a", "gpu-1"}: "matches gpu",
				{"node-b", "gpu-0"}: `rejected: device.attributes["gpu.prism.dev"].productName != "NVIDIA L40S"`,
				{"node-b", "gpu-1"}: "matches gpu, 10746Mi of memory free (shared with team-b/infer-1, team-b/infer-2)",
				{"node-b", "gpu-2"}: `rejected: device.attributes["gpu.prism.dev"].productName != "NVIDIA L40S": `,
				{"node-b", "eth0"}:  `rejected: class gpu.prism.dev: device.driver == "gpu.prism.dev"`,
			},
			wantAllocated: key{"node-a", "gpu-1"},
			wantHeldBy: map[key]string{
				{"node-a", "gpu-0"}: "ml/other-gpu (whole GPU)",
				{"node-b", "gpu-1"}: "team-b/infer-1 (shared 8Gi), team-b/infer-2 (shared 4Gi)",
			},
		},
		{
			name: "missing class",
			claim: func(t *testing.T) *resourceapi.ResourceClaim {
				return explaintest.Load[*resourceapi.ResourceClaim](t, "claim.json")
			},
			want: map[key]string{
				{"node-a", "gpu-0"}: `rejected: device class "gpu.prism.dev" not found`,
				{"node-a", "gpu-1"}: `rejected: device class "gpu.prism.dev" not found`,
				{"node-b", "gpu-0"}: `rejected: device class "gpu.prism.dev" not found`,
				{"node-b", "gpu-1"}: `rejected: device class "gpu.prism.dev" not found`,
				{"node-b", "gpu-2"}: `rejected: device class "gpu.prism.dev" not found`,
				{"node-b", "eth0"}:  `rejected: device class "gpu.prism.dev" not found`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			rows := Explain(ctx, tc.claim(t), slices, tc.classes, tc.holders)
			if len(rows) != len(tc.want) {
				t.Errorf("%d rows, want %d (the stale pool generation must be ignored): %+v", len(rows), len(tc.want), rows)
			}
			for _, r := range rows {
				k := key{r.Node, r.Device}
				want, ok := tc.want[k]
				if !ok {
					t.Errorf("unexpected row %+v", r)
					continue
				}
				if !strings.HasPrefix(r.Verdict, want) {
					t.Errorf("%v: verdict %q, want prefix %q", k, r.Verdict, want)
				}
				if (r.Matched != "") != strings.HasPrefix(want, "matches") {
					t.Errorf("%v: matched %q with verdict %q", k, r.Matched, r.Verdict)
				}
				if gotAlloc := r.Allocated != ""; gotAlloc != (k == tc.wantAllocated) {
					t.Errorf("%v: allocated %q", k, r.Allocated)
				}
				if got, want := joinHolders(r.HeldBy), cmp.Or(tc.wantHeldBy[k], "-"); got != want {
					t.Errorf("%v: held by %q, want %q", k, got, want)
				}
			}
		})
	}
}

func TestWriteTable(t *testing.T) {
	rows := []Row{
		{Node: "node-a", Device: "gpu-0", Product: "NVIDIA H100 80GB HBM3", Class: "ultra", Request: "gpu", Matched: "gpu/ultra", Verdict: "matches gpu/ultra, but ml/other holds it",
			HeldBy: []Holder{{Namespace: "ml", Name: "other", Request: "gpu"}}},
		{Node: "node-a", Device: "gpu-1", Product: "NVIDIA A100\tSXM4", Class: "high", Request: "gpu", Matched: "gpu/high", Verdict: "matches gpu/high", Allocated: "gpu/high"},
		{Node: "node-b", Device: "gpu-2", Request: "gpu", Verdict: "rejected: " + strings.Repeat("x", 200)},
	}
	tests := []struct {
		name string
		rows []Row
		wide bool
		want string
	}{
		{name: "narrow", rows: rows, want: "table.txt"},
		{name: "wide", rows: rows, wide: true, want: "table-wide.txt"},
		{name: "two requests", rows: append(rows[:1:1], Row{Node: "node-a", Device: "gpu-0", Request: "nic", Verdict: "rejected: x"}), want: "table-requests.txt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteTable(&buf, tc.rows, tc.wide); err != nil {
				t.Fatal(err)
			}
			goldentest.Compare(t, filepath.Join("testdata", tc.want), buf.Bytes())
		})
	}
}

func TestHolders(t *testing.T) {
	got := Holders(explaintest.Load[[]resourceapi.ResourceClaim](t, "claims.json"))
	eightGi, fourGi := resource.MustParse("8Gi"), resource.MustParse("4Gi")
	want := map[DeviceID][]Holder{
		{"gpu.prism.dev", "node-a", "gpu-1"}: {{Namespace: "ml", Name: "trainer-0-gpu", Request: "gpu", Pods: []string{"trainer-0"}}},
		{"gpu.prism.dev", "node-a", "gpu-0"}: {{Namespace: "ml", Name: "other-gpu", Request: "gpu/ultra", Pods: []string{"other-0", "other-1"}}},
		{"gpu.prism.dev", "node-b", "gpu-1"}: {
			{Namespace: "team-b", Name: "infer-1", Request: "gpu", Shared: true, Memory: &eightGi},
			{Namespace: "team-b", Name: "infer-2", Request: "gpu", Pods: []string{"infer-2-pod"}, Shared: true, Memory: &fourGi},
		},
	}
	if !equality.Semantic.DeepEqual(want, got) {
		t.Errorf("holders:\n%+v\nwant\n%+v", got, want)
	}
}

func TestMisplacedProfileAnnotation(t *testing.T) {
	profiled := map[string]string{prismv1alpha1.ProfileAnnotation: "train"}
	tests := []struct {
		name string
		tmpl resourceapi.ResourceClaimTemplate
		want string
	}{
		{name: "on the template's metadata only",
			tmpl: resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Annotations: profiled}},
			want: "prism.dev/profile=train on ResourceClaimTemplate gpu's own metadata is ignored: claims are made from spec.metadata, so put it under spec.metadata.annotations"},
		{name: "under spec.metadata",
			tmpl: resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}, Spec: resourceapi.ResourceClaimTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: profiled}}}},
		{name: "in both places",
			tmpl: resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Annotations: profiled}, Spec: resourceapi.ResourceClaimTemplateSpec{ObjectMeta: metav1.ObjectMeta{Annotations: profiled}}}},
		{name: "none", tmpl: resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := MisplacedOnTemplate(&tc.tmpl); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	pod := &metav1.ObjectMeta{Name: "trainer-0", Annotations: profiled}
	if got, want := MisplacedOnPod(pod), "prism.dev/profile=train on Pod trainer-0 is ignored: put it on the ResourceClaim, or under spec.metadata.annotations of its ResourceClaimTemplate"; got != want {
		t.Errorf("pod: got %q, want %q", got, want)
	}
	if got := MisplacedOnPod(&metav1.ObjectMeta{Name: "plain"}); got != "" {
		t.Errorf("pod without the annotation: %q", got)
	}
}

// TestMisplacedProfileAnnotationIsBounded: the warnings quote at most 64
// bytes of a value that is no WorkloadProfile name, and its length.
func TestMisplacedProfileAnnotationIsBounded(t *testing.T) {
	huge := map[string]string{prismv1alpha1.ProfileAnnotation: strings.Repeat("p", 200<<10)}
	shown := `prism.dev/profile="` + strings.Repeat("p", 64) + `"... (204800 bytes) on `
	for name, got := range map[string]string{
		"template": MisplacedOnTemplate(&resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Annotations: huge}}),
		"pod":      MisplacedOnPod(&metav1.ObjectMeta{Name: "trainer-0", Annotations: huge}),
	} {
		if !strings.HasPrefix(got, shown) || len(got) > 512 {
			t.Errorf("%s: warning of %d bytes %.300q, want at most 512 starting %q", name, len(got), got, shown)
		}
	}
}

func TestAvailability(t *testing.T) {
	q := resource.MustParse
	gib := q("1Gi")
	shareable := resourceapi.Device{Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.prism.dev/memory": {
		Value: q("23034Mi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &gib}},
	}}}
	share := func(name, memory string) Holder {
		m := q(memory)
		return Holder{Namespace: "ml", Name: name, Shared: true, Memory: &m}
	}
	tests := []struct {
		name   string
		heldBy []Holder
		device resourceapi.Device
		want   string
	}{
		{name: "free", device: shareable, want: ""},
		{name: "held whole", heldBy: []Holder{{Namespace: "ml", Name: "a"}}, device: shareable, want: ", but ml/a holds it"},
		{name: "room left", heldBy: []Holder{share("a", "8Gi")}, device: shareable, want: ", 14842Mi of memory free (shared with ml/a)"},
		{name: "less left than the smallest share", heldBy: []Holder{share("a", "22Gi")}, device: shareable, want: ", but its memory is held by ml/a"},
		{name: "memory not published", heldBy: []Holder{{Namespace: "ml", Name: "a", Shared: true}}, want: ", shared with ml/a"},
		{name: "compute and memory left", heldBy: []Holder{computeShare("a", "45", "8Gi"), computeShare("b", "30", "4Gi")}, device: withCompute(shareable),
			want: ", 25% of compute and 10746Mi of memory free (shared with ml/a, ml/b)"},
		{name: "compute held, memory left", heldBy: []Holder{computeShare("a", "50", "8Gi"), computeShare("b", "50", "4Gi")}, device: withCompute(shareable),
			want: ", but its compute is held by ml/a, ml/b"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := availability(tc.heldBy, tc.device, "gpu.prism.dev"); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// A claim that names no amount gets the default share of a shareable GPU,
// all of its memory rounded down to the step: that is the whole GPU, not a
// share, though the allocation has a share ID and consumed capacity.
func TestOnDevice(t *testing.T) {
	q := resource.MustParse
	gib, whole := q("1Gi"), q("22Gi")
	shareable := resourceapi.Device{Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{"gpu.prism.dev/memory": {
		Value: q("23034Mi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{Default: &whole, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &gib, Step: &gib}},
	}}}
	share := func(name, memory string) Holder {
		m := q(memory)
		return Holder{Namespace: "ml", Name: name, Shared: true, Memory: &m}
	}
	tests := []struct {
		name    string
		holders []Holder
		device  resourceapi.Device
		want    string
	}{
		{name: "the default share", holders: []Holder{share("a", "22Gi")}, device: shareable, want: "ml/a (whole GPU)"},
		{name: "two shares", holders: []Holder{share("a", "8Gi"), share("b", "4Gi")}, device: shareable, want: "ml/a (shared 8Gi), ml/b (shared 4Gi)"},
		{name: "room for one more share", holders: []Holder{share("a", "21Gi")}, device: shareable, want: "ml/a (shared 21Gi)"},
		{name: "held whole", holders: []Holder{{Namespace: "ml", Name: "a"}}, device: shareable, want: "ml/a (whole GPU)"},
		{name: "memory not published", holders: []Holder{share("a", "22Gi")}, want: "ml/a (shared 22Gi)"},
		// Memory alone leaves room, but a claim that names no compute took
		// all of it.
		{name: "a memory share with the default compute", holders: []Holder{computeShare("a", "100", "8Gi")}, device: withCompute(shareable), want: "ml/a (whole GPU)"},
		{name: "compute and memory shares", holders: []Holder{computeShare("a", "45", "8Gi"), computeShare("b", "30", "4Gi")}, device: withCompute(shareable),
			want: "ml/a (shared 45% 8Gi), ml/b (shared 30% 4Gi)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := joinHolders(tc.holders)
			if got := joinHolders(onDevice(tc.holders, tc.device, "gpu.prism.dev")); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if after := joinHolders(tc.holders); after != before {
				t.Errorf("onDevice changed its input from %q to %q", before, after)
			}
		})
	}
}

// withCompute publishes compute on a shareable device as the plugin does:
// 100 per cent, in steps of 5.
func withCompute(d resourceapi.Device) resourceapi.Device {
	d = *d.DeepCopy()
	step, whole := resource.MustParse("5"), resource.MustParse("100")
	d.Capacity["gpu.prism.dev/compute"] = resourceapi.DeviceCapacity{Value: whole, RequestPolicy: &resourceapi.CapacityRequestPolicy{
		Default: &whole, ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: &step, Max: &whole, Step: &step}}}
	return d
}

// computeShare holds compute per cent and memory of a device.
func computeShare(name, compute, memory string) Holder {
	c, m := resource.MustParse(compute), resource.MustParse(memory)
	return Holder{Namespace: "ml", Name: name, Shared: true, Compute: &c, Memory: &m}
}
