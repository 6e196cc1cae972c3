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
	"reflect"
	"testing"

	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/tools/record"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// The claim webhook, in affinity mode, reaches the pod webhook's decision:
// no hard needs, so the claim stays as written, and its plan carries the
// pod's terms.
func TestClaimAndPodAgree(t *testing.T) {
	fleet := &rewrite.Fleet{Models: []rewrite.Model{
		{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20},
		{Name: "NVIDIA L4", Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300, MemoryBytes: 22 << 30},
	}}
	stream := webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound })
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(Options{Profiles: fakeReader(t, stream), Policy: prismv1alpha1.PolicyPerformance, Recorder: record.NewFakeRecorder(10), Metrics: m,
		Fleet: func() *rewrite.Fleet { return fleet }, Preference: rewrite.PreferAffinity})
	if err != nil {
		t.Fatal(err)
	}
	object := webhooktest.ReadFixture(t, "claim-profiled.json")
	claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
	if claim.Spec.Devices.Requests[0].FirstAvailable != nil {
		t.Errorf("claim got a ladder in affinity mode: %+v", claim.Spec.Devices.Requests[0])
	}
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
		t.Fatal(err)
	}
	want, err := rewrite.NodePreference(webhook.ProfileOf(stream, prismv1alpha1.PolicyPerformance), rewrite.WithFleet(fleet), rewrite.WithPreference(rewrite.PreferAffinity))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Preference == nil || !reflect.DeepEqual(*plan.Preference, *want) || want.Mode != rewrite.PreferAffinity {
		t.Errorf("claim's plan preference %+v, pod webhook's %+v", plan.Preference, want)
	}
}
