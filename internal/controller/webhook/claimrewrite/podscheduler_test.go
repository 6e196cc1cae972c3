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
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

const podUID = types.UID("pod-uid")

func pod(uid types.UID, scheduler string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: webhooktest.Namespace, UID: uid}, Spec: corev1.PodSpec{SchedulerName: scheduler}}
}

// podSchedulers reads cached from the informer and api from the API server.
func podSchedulers(cached, api []*corev1.Pod) PodSchedulers {
	var objs []client.Object
	for _, p := range cached {
		objs = append(objs, p)
	}
	cs := kubefake.NewClientset()
	for _, p := range api {
		if err := cs.Tracker().Add(p); err != nil {
			panic(err)
		}
	}
	return PodSchedulers{Cache: fake.NewClientBuilder().WithObjects(objs...).Build(), API: cs.CoreV1()}
}

// ownedBy is a claim made from a template of the pod with uid.
func ownedBy(kind string, uid types.UID) *resourceapi.ResourceClaim {
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{GenerateName: "trainer-0-gpu-", Namespace: webhooktest.Namespace,
		Annotations: map[string]string{resourceapi.PodResourceClaimAnnotation: "gpu"}}}
	if kind != "" {
		claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: kind, Name: "trainer-0", UID: uid, Controller: ptr.To(true)}}
	}
	return claim
}

func TestSchedulerOf(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	kai := pod(podUID, "kai-scheduler")
	for _, tc := range []struct {
		name        string
		claim       *resourceapi.ResourceClaim
		cached, api []*corev1.Pod
		cacheErr    error
		// unsynced: the informer has not synced, and would wait for it.
		unsynced bool
		want     string
		wantErr  string
	}{
		{name: "from the informer", claim: ownedBy("Pod", podUID), cached: []*corev1.Pod{kai}, want: "kai-scheduler"},
		{name: "not in the informer yet", claim: ownedBy("Pod", podUID), api: []*corev1.Pod{kai}, want: "kai-scheduler"},
		{name: "the informer's pod is an older one of the same name", claim: ownedBy("Pod", podUID),
			cached: []*corev1.Pod{pod("old-uid", "default-scheduler")}, api: []*corev1.Pod{kai}, want: "kai-scheduler"},
		{name: "no such pod", claim: ownedBy("Pod", podUID), api: []*corev1.Pod{pod("other-uid", "kai-scheduler")}, wantErr: "the claim's pod was not found: ml/trainer-0, uid pod-uid"},
		{name: "the informer fails", claim: ownedBy("Pod", podUID), cached: []*corev1.Pod{kai}, cacheErr: errors.New("informer stopped"), wantErr: "reading pod ml/trainer-0 from the informer: informer stopped"},
		{name: "the informer has not synced: listed from the API", claim: ownedBy("Pod", podUID), unsynced: true,
			cached: []*corev1.Pod{pod(podUID, "default-scheduler")}, cacheErr: errors.New("informer not synced"), api: []*corev1.Pod{kai}, want: "kai-scheduler"},
		{name: "made by hand", claim: ownedBy("", ""), cached: []*corev1.Pod{kai}},
		{name: "owned by something else", claim: ownedBy("Job", podUID), cached: []*corev1.Pod{kai}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := podSchedulers(tc.cached, tc.api)
			if tc.cacheErr != nil {
				s.Cache = interceptor.NewClient(s.Cache.(client.WithWatch), interceptor.Funcs{
					Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
						return tc.cacheErr
					},
				})
			}
			if tc.unsynced {
				s.CacheSynced = webhook.NewSynced("pods", nil)
			}
			got, err := s.SchedulerOf(ctx, tc.claim)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if got != tc.want {
				t.Errorf("scheduler %q, want %q", got, tc.want)
			}
		})
	}
}

// TestKeepSchedulerName: the informer's pods keep their scheduler's name
// and are otherwise trimmed as before.
func TestKeepSchedulerName(t *testing.T) {
	full := pod(podUID, "kai-scheduler")
	full.Spec.Containers = []corev1.Container{{Name: "train", Image: "trainer"}}
	full.Status.ResourceClaimStatuses = []corev1.PodResourceClaimStatus{{Name: "gpu", ResourceClaimName: ptr.To("trainer-0-gpu-x7k2p")}}
	want, err := fleet.TrimPod(full.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want.(*corev1.Pod).Spec.SchedulerName = "kai-scheduler"
	got, err := KeepSchedulerName(fleet.TrimPod)(full)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("trimmed pod (-want +got):\n%s", diff)
	}
	tombstone := "not a pod"
	if got, err := KeepSchedulerName(fleet.TrimPod)(tombstone); err != nil || got != tombstone {
		t.Errorf("a non-pod came back as %v, %v", got, err)
	}
}

// TestRewriterForThePodsScheduler: a claim whose pod a scheduler of
// NoLadderSchedulers places keeps its exactly requests, with the hard
// needs, and says why in its plan and an Event; any other claim, and one
// whose pod cannot be read, gets its ladder.
func TestRewriterForThePodsScheduler(t *testing.T) {
	const noLadder = "kai-scheduler counts only exactly requests (NVIDIA/KAI-Scheduler#900)"
	for _, tc := range []struct {
		name       string
		schedulers []string
		owner      string // the claim's controlling owner's kind
		cached     []*corev1.Pod
		wantLadder bool
		wantEvent  string
		wantPlan   string // the plan's noLadder
	}{
		{name: "kube-scheduler", schedulers: []string{"kai-scheduler"}, owner: "Pod", cached: []*corev1.Pod{pod(podUID, corev1.DefaultSchedulerName)},
			wantLadder: true, wantEvent: "Normal Rewritten profile train (MemoryBound, performance): gpu -> firstAvailable [ultra, high, fits]"},
		{name: "kai-scheduler", schedulers: []string{"kai-scheduler"}, owner: "Pod", cached: []*corev1.Pod{pod(podUID, "kai-scheduler")},
			wantEvent: "Normal LadderNotWritten profile train (MemoryBound, performance): ladder not written: " + noLadder +
				"; exactly requests kept, with the hard needs as a selector: gpu; 1 request(s) untouched",
			wantPlan: noLadder},
		{name: "a renamed kai-scheduler", schedulers: []string{"kai-gpu"}, owner: "Pod", cached: []*corev1.Pod{pod(podUID, "kai-gpu")},
			wantEvent: "Normal LadderNotWritten profile train (MemoryBound, performance): ladder not written: kai-gpu counts", wantPlan: "kai-gpu counts only exactly requests (NVIDIA/KAI-Scheduler#900)"},
		{name: "kai-scheduler, not in the list", schedulers: []string{"kai-gpu"}, owner: "Pod", cached: []*corev1.Pod{pod(podUID, "kai-scheduler")},
			wantLadder: true, wantEvent: "Normal Rewritten"},
		{name: "no list", owner: "Pod", cached: []*corev1.Pod{pod(podUID, "kai-scheduler")}, wantLadder: true, wantEvent: "Normal Rewritten"},
		{name: "the pod is not found", schedulers: []string{"kai-scheduler"}, owner: "Pod", wantLadder: true, wantEvent: "Normal Rewritten"},
		{name: "a claim made by hand", schedulers: []string{"kai-scheduler"}, cached: []*corev1.Pod{pod(podUID, "kai-scheduler")}, wantLadder: true, wantEvent: "Normal Rewritten"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			events := record.NewFakeRecorder(10)
			h, err := New(Options{Profiles: fakeReader(t, memoryBound), Policy: prismv1alpha1.PolicyPerformance, Recorder: events, Metrics: m,
				NoLadderSchedulers: tc.schedulers, PodScheduler: podSchedulers(tc.cached, nil).SchedulerOf})
			if err != nil {
				t.Fatal(err)
			}
			object := ownedFixture(t, tc.owner)
			claim := applyPatch(t, object, webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object)))
			gpu := claim.Spec.Devices.Requests[0]
			if gotLadder := len(gpu.FirstAvailable) > 0; gotLadder != tc.wantLadder || gotLadder == (gpu.Exactly != nil) {
				t.Errorf("gpu request %+v, want a ladder: %v", gpu, tc.wantLadder)
			}
			if !tc.wantLadder && len(gpu.Exactly.Selectors) != 2 {
				t.Errorf("gpu request's selectors %+v, want the hard needs and the user's", gpu.Exactly.Selectors)
			}
			var plan rewrite.Plan
			if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
				t.Fatalf("rewrite annotation: %v", err)
			}
			if diff := cmp.Diff(tc.wantPlan, plan.NoLadder); diff != "" {
				t.Errorf("plan's noLadder (-want +got):\n%s", diff)
			}
			select {
			case e := <-events.Events:
				if !strings.HasPrefix(e, tc.wantEvent) {
					t.Errorf("event %q, want prefix %q", e, tc.wantEvent)
				}
			default:
				t.Errorf("no event, want %q", tc.wantEvent)
			}
		})
	}
}

// ownedFixture is claim-profiled.json made from a template of the pod
// trainer-0, or by hand for an empty kind.
func ownedFixture(t *testing.T, kind string) []byte {
	t.Helper()
	var claim resourceapi.ResourceClaim
	if err := json.Unmarshal(webhooktest.ReadFixture(t, "claim-profiled.json"), &claim); err != nil {
		t.Fatal(err)
	}
	claim.OwnerReferences = ownedBy(kind, podUID).OwnerReferences
	object, err := json.Marshal(&claim)
	if err != nil {
		t.Fatal(err)
	}
	return object
}
