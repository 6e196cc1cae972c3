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
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/tools/record"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestRewriterCutsFromFleet: with a fleet view, the webhook cuts each claim
// from the fleet as it is at admission, and says so in the annotation.
func TestRewriterCutsFromFleet(t *testing.T) {
	h100 := rewrite.Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20}
	l40s := rewrite.Model{Name: "NVIDIA L40S", Devices: 8, BandwidthGBps: 864, FP32GFLOPS: 91600, MemoryBytes: 45 << 30}
	fleet := &rewrite.Fleet{Models: []rewrite.Model{h100}}
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	// No memory need: with one, an H100-only fleet would still get the
	// fits tier for its floor.
	stream := webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound })
	h, err := New(Options{Profiles: fakeReader(t, stream), Policy: prismv1alpha1.PolicyPerformance, Recorder: record.NewFakeRecorder(10), Metrics: m,
		Fleet: func() *rewrite.Fleet { return fleet }})
	if err != nil {
		t.Fatal(err)
	}
	object := webhooktest.ReadFixture(t, "claim-profiled.json")

	resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object))
	if resp.Patch != nil || testutil.ToFloat64(m.skipped.WithLabelValues(skipNoEligible)) != 1 {
		t.Fatalf("an H100-only fleet: want the claim unchanged (%s), got patch %s", skipNoEligible, resp.Patch)
	}

	fleet = &rewrite.Fleet{Models: []rewrite.Model{h100, l40s}}
	claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
	var names []string
	for _, s := range claim.Spec.Devices.Requests[0].FirstAvailable {
		names = append(names, s.Name)
	}
	if !slices.Equal(names, []string{"bandwidth-top", "fits"}) {
		t.Errorf("after L40S nodes joined: alternatives %v, want [bandwidth-top fits]", names)
	}
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(plan.Fleet, "NVIDIA L40S 864 x8") || !strings.Contains(plan.Alternatives[0].Reason, "1 of 2 models, 8 of 16 devices") {
		t.Errorf("annotation does not show the fleet figures that chose the cut: %+v", plan)
	}
}
