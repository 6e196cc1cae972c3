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

package podaffinity

import (
	"context"
	"encoding/json"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

func gpuRequestSpec() resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
}

func podObject(t *testing.T, affinity *corev1.Affinity, claims ...corev1.PodResourceClaim) []byte {
	t.Helper()
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "train-0", Namespace: "ml"},
		Spec:       corev1.PodSpec{ResourceClaims: claims, Affinity: affinity, Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	data, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestPodPreference(t *testing.T) {
	h100 := rewrite.Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20}
	l4 := rewrite.Model{Name: "NVIDIA L4", Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300, MemoryBytes: 22 << 30}
	a100 := rewrite.Model{Name: "NVIDIA A100-SXM4-80GB", Devices: 8, BandwidthGBps: 2039, FP32GFLOPS: 19500, MemoryBytes: 80 << 30}
	threeModels := &rewrite.Fleet{Models: []rewrite.Model{h100, a100, l4}}
	mixedL4 := l4
	mixedL4.MixedDevices = 4
	stream := webhooktest.Profile("stream", func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound })
	unmeasured := webhooktest.Profile("new", func(*prismv1alpha1.WorkloadProfile) {})
	big := webhooktest.Profile("big", func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
		wp.Status.PeakMemory = ptr.To(resource.MustParse("20Gi"))
	})
	template := func(name, prof string) *resourceapi.ResourceClaimTemplate {
		return &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}, Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: prof}}, Spec: gpuRequestSpec()}}
	}
	// A claim the claim webhook rewrote in affinity mode before the pod came.
	plan, _ := json.Marshal(rewrite.Plan{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, Preference: &rewrite.Decision{
		Mode: rewrite.PreferAffinity, Terms: []rewrite.NodeTerm{{Weight: 100, Tier: "bandwidth-top", Models: []string{h100.Name}}}}})
	named := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "ml", Annotations: map[string]string{rewrite.AnnotationKey: string(plan)}}}
	// A claim rewritten with a memory floor the L4 is below.
	floorPlan, _ := json.Marshal(rewrite.Plan{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, Preference: &rewrite.Decision{
		Mode: rewrite.PreferAffinity, Terms: []rewrite.NodeTerm{{Weight: 100, Tier: "bandwidth-top", Models: []string{h100.Name}}}, Exclude: []string{l4.Name}}})
	namedFloor := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared-big", Namespace: "ml", Annotations: map[string]string{rewrite.AnnotationKey: string(floorPlan)}}}
	// No API server holds a profile of this name; the cache would, from a
	// CRD installed without name validation, and the pod webhook looked it up.
	upperCase := webhooktest.Profile("Stream", func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound })
	reader := webhooktest.Reader(t, stream, unmeasured, big, upperCase, template("train", "stream"), template("fresh", "new"), template("plain", ""), template("train-big", "big"),
		template("bad-name", "Stream"))
	// The claim informer's store, which holds the claims as its transform
	// makes them.
	claims := cache.NewStore(cache.MetaNamespaceKeyFunc)
	for _, c := range []*resourceapi.ResourceClaim{named, namedFloor} {
		trimmed, err := fleet.TrimClaim(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := claims.Add(trimmed); err != nil {
			t.Fatal(err)
		}
	}
	h100Term := corev1.PreferredSchedulingTerm{Weight: 100, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
		{Key: rewrite.ModelLabel, Operator: corev1.NodeSelectorOpIn, Values: []string{"NVIDIA-H100-80GB-HBM3"}}}}}
	required := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}}}}}
	fromTemplate := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("train")}
	withFloor := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("train-big")}
	notL4 := corev1.NodeSelectorRequirement{Key: rewrite.ModelLabel, Operator: corev1.NodeSelectorOpNotIn, Values: []string{"NVIDIA-L4"}}
	zoneA := corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}
	nodeOne := corev1.NodeSelectorRequirement{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-1"}}
	twoTerms := &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{zoneA}}, {MatchFields: []corev1.NodeSelectorRequirement{nodeOne}}}}}}
	onlyNotL4 := &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{notL4}}}}

	for _, tc := range []struct {
		name       string
		preference rewrite.PreferenceMode
		fleet      *rewrite.Fleet
		affinity   *corev1.Affinity
		claims     []corev1.PodResourceClaim
		outcome    string
		// want is the pod's preferred terms after the patch; nil: no patch.
		want []corev1.PreferredSchedulingTerm
		// required is the pod's required node selector after the patch;
		// nil: the pod's own.
		required *corev1.NodeSelector
	}{
		{"a memory floor keeps the pod off the nodes below it", rewrite.PreferAffinity, threeModels, nil,
			[]corev1.PodResourceClaim{withFloor}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, onlyNotL4},
		{"the exclusion is ANDed into each of the pod's own required terms", rewrite.PreferAffinity, threeModels, twoTerms,
			[]corev1.PodResourceClaim{withFloor}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchExpressions: []corev1.NodeSelectorRequirement{zoneA, notL4}},
				{MatchExpressions: []corev1.NodeSelectorRequirement{notL4}, MatchFields: []corev1.NodeSelectorRequirement{nodeOne}}}}},
		{"a named claim's plan gives the exclusion", rewrite.PreferAffinity, threeModels, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("shared-big")}}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, onlyNotL4},
		{"no memory floor, no exclusion", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{fromTemplate}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, nil},
		{"template's profile prefers the H100 nodes", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{fromTemplate}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, nil},
		{"the pod's own affinity stays, required terms too", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, required,
			[]corev1.PodResourceClaim{fromTemplate}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, nil},
		{"a named claim's plan gives the terms", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("shared")}}, podAffinityAdded, []corev1.PreferredSchedulingTerm{h100Term}, nil},
		{"ladder mode admits unchanged", rewrite.PreferLadder, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{fromTemplate}, podLadderMode, nil, nil},
		{"a mixed fleet keeps the ladder", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, mixedL4}}, nil,
			[]corev1.PodResourceClaim{fromTemplate}, podNoPreference, nil, nil},
		{"a named claim not in the cache costs the preference only", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To("missing")}}, podNotCached, nil, nil},
		{"a template not in the cache costs the preference only", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("missing")}}, podNotCached, nil, nil},
		{"an unmeasured profile is profiled, not preferred", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("fresh")}}, podProfileUnmeasured, nil, nil},
		{"a template without a profile", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("plain")}}, podNoProfiledClaim, nil, nil},
		{"a template whose profile is no WorkloadProfile name names none", rewrite.PreferAffinity, &rewrite.Fleet{Models: []rewrite.Model{h100, l4}}, nil,
			[]corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("bad-name")}}, podNoProfiledClaim, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			h, err := New(Options{Templates: reader, Claims: claims, Profiles: reader, Policy: prismv1alpha1.PolicyPerformance,
				Preference: tc.preference, Fleet: func() *rewrite.Fleet { return tc.fleet }, Metrics: m})
			if err != nil {
				t.Fatal(err)
			}
			object := podObject(t, tc.affinity, tc.claims...)
			resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.PodGVK, object))
			if !resp.Allowed {
				t.Fatal("pod denied")
			}
			if got := testutil.ToFloat64(m.outcomes.WithLabelValues(tc.outcome)); got != 1 {
				t.Errorf("outcome %s counted %v times, want 1", tc.outcome, got)
			}
			if tc.want == nil {
				if resp.Patch != nil {
					t.Errorf("patch %s, want none", resp.Patch)
				}
				return
			}
			pod := webhooktest.PatchedAs[corev1.Pod](t, object, resp)
			na := pod.Spec.Affinity.NodeAffinity
			if !reflect.DeepEqual(na.PreferredDuringSchedulingIgnoredDuringExecution, tc.want) {
				t.Errorf("preferred terms %+v, want %+v", na.PreferredDuringSchedulingIgnoredDuringExecution, tc.want)
			}
			wantRequired := tc.required
			if wantRequired == nil && tc.affinity != nil {
				wantRequired = tc.affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
			}
			if !reflect.DeepEqual(na.RequiredDuringSchedulingIgnoredDuringExecution, wantRequired) {
				t.Errorf("required terms %+v, want %+v", na.RequiredDuringSchedulingIgnoredDuringExecution, wantRequired)
			}
			var note Note
			if err := json.Unmarshal([]byte(pod.Annotations[rewrite.AnnotationKey]), &note); err != nil || note.Claims["gpu"].Mode != rewrite.PreferAffinity {
				t.Errorf("pod annotation %q does not say affinity for claim gpu (%v)", pod.Annotations[rewrite.AnnotationKey], err)
			}
		})
	}
}

// TestPodPreferenceBeforeClaimsSync: before the claims have synced, a pod
// that names a claim the store holds, or that names none, is answered at
// once; one that names a claim the store does not hold yet waits for the
// whole store and is answered from it, as the controller answers it once
// the claims have synced, or past its deadline is admitted unchanged.
func TestPodPreferenceBeforeClaimsSync(t *testing.T) {
	h100 := rewrite.Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20}
	l4 := rewrite.Model{Name: "NVIDIA L4", Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300, MemoryBytes: 22 << 30}
	fleetOf := func() *rewrite.Fleet { return &rewrite.Fleet{Models: []rewrite.Model{h100, l4}} }
	stream := webhooktest.Profile("stream", func(wp *prismv1alpha1.WorkloadProfile) { wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound })
	reader := webhooktest.Reader(t, stream, &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "train", Namespace: "ml"}, Spec: resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: "stream"}}, Spec: gpuRequestSpec()}})
	plan, _ := json.Marshal(rewrite.Plan{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyPerformance, Preference: &rewrite.Decision{
		Mode: rewrite.PreferAffinity, Terms: []rewrite.NodeTerm{{Weight: 100, Tier: "bandwidth-top", Models: []string{h100.Name}}}}})
	shared, err := fleet.TrimClaim(&resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "shared", Namespace: "ml", Annotations: map[string]string{rewrite.AnnotationKey: string(plan)}}})
	if err != nil {
		t.Fatal(err)
	}
	named := corev1.PodResourceClaim{Name: "gpu", ResourceClaimName: ptr.To("shared")}
	fromTemplate := corev1.PodResourceClaim{Name: "gpu", ResourceClaimTemplateName: ptr.To("train")}
	for _, tc := range []struct {
		name  string
		claim corev1.PodResourceClaim
		// listed are the claims read before the review, rest those read
		// while it waits; synced: the informer then syncs.
		listed, rest []any
		synced       bool
		deadline     time.Duration
		wantWait     bool
		// wantOutcome, where the review is not answered as the whole store
		// answers it.
		wantOutcome string
	}{
		{name: "a named claim the store holds", claim: named, listed: []any{shared}, deadline: time.Minute},
		{name: "a claim from a template reads no claims", claim: fromTemplate, deadline: time.Minute},
		{name: "a named claim read while the review waits", claim: named, rest: []any{shared}, synced: true, deadline: time.Minute, wantWait: true},
		{name: "a named claim the whole store lacks", claim: named, synced: true, deadline: time.Minute, wantWait: true},
		{name: "not synced by the deadline", claim: named, deadline: 200 * time.Millisecond, wantWait: true, wantOutcome: podNotSynced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			handler := func(claims cache.Store, synced *webhook.Synced) (http.Handler, *Metrics) {
				m, err := NewMetrics(nil)
				if err != nil {
					t.Fatal(err)
				}
				h, err := New(Options{Templates: reader, Claims: claims, ClaimsSynced: synced, Profiles: reader, Policy: prismv1alpha1.PolicyPerformance,
					Preference: rewrite.PreferAffinity, Fleet: fleetOf, Metrics: m})
				if err != nil {
					t.Fatal(err)
				}
				return h, m
			}
			body := webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.PodGVK, podObject(t, nil, tc.claim))
			whole := cache.NewStore(cache.MetaNamespaceKeyFunc)
			store := cache.NewStore(cache.MetaNamespaceKeyFunc)
			for _, c := range append(tc.listed, tc.rest...) {
				if err := whole.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			for _, c := range tc.listed {
				if err := store.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			wholeHandler, _ := handler(whole, nil)
			want := webhooktest.Call(t, wholeHandler, body)
			if tc.wantOutcome != "" {
				want = webhook.Allowed()
			}

			synced := webhook.NewSynced("claims", nil)
			h, m := handler(store, synced)
			ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
			defer cancel()
			review := webhooktest.Post(ctx, t, h, body)
			if tc.wantWait {
				review.NotAnsweredWithin(50*time.Millisecond, "before the claims synced")
			}
			for _, c := range tc.rest {
				if err := store.Add(c); err != nil {
					t.Fatal(err)
				}
			}
			if tc.synced {
				synced.MarkSynced()
			}
			if diff := cmp.Diff(webhooktest.VerdictOf(want), webhooktest.VerdictOf(review.Answer())); diff != "" {
				t.Errorf("answer (-whole store +this one):\n%s", diff)
			}
			if tc.wantOutcome != "" {
				if n := testutil.ToFloat64(m.outcomes.WithLabelValues(tc.wantOutcome)); n != 1 {
					t.Errorf("outcome %s counted %v times, want 1", tc.wantOutcome, n)
				}
			}
		})
	}
}
