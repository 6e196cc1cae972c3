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

package profilewrites

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
)

func profiledClaim(uid types.UID, namespace, profile string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: string(uid), Namespace: namespace, UID: uid}}
	if profile != "" {
		c.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: profile}
	}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

func gpuOn(node string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "gpu", Driver: "gpu.prism.dev", Pool: node, Device: "gpu-0"}
}

type writable struct{ namespace, profile, node string }

func TestProfileClaims(t *testing.T) {
	now := time.Now()
	p := NewProfileClaims()
	p.now = func() time.Time { return now }

	// The informer stores claims through fleet.TrimClaim.
	trimmed := func(c *resourceapi.ResourceClaim) *fleet.Claim {
		c.Spec.Devices.Requests = []resourceapi.DeviceRequest{{Name: "gpu"}}
		c.Annotations["other"] = "dropped"
		out, err := fleet.TrimClaim(c)
		if err != nil {
			t.Fatal(err)
		}
		return out.(*fleet.Claim)
	}
	trainA := trimmed(profiledClaim("a", "ml", "train", gpuOn("node-a")))
	trainB := profiledClaim("b", "ml", "train", gpuOn("node-a"))
	steps := []struct {
		name    string
		event   func()
		advance time.Duration
		want    []writable // all others are not writable
	}{
		{name: "claim allocated on node-a", event: func() { p.OnAdd(trainA, true) },
			want: []writable{{"ml", "train", "node-a"}}},
		{name: "pending, unannotated and foreign-driver claims add nothing", event: func() {
			p.OnAdd(profiledClaim("c", "ml", "infer"), false)
			p.OnAdd(profiledClaim("d", "ml", "", gpuOn("node-b")), false)
			p.OnAdd(profiledClaim("e", "ml", "infer", resourceapi.DeviceRequestAllocationResult{Driver: "nic.example.com", Pool: "node-b", Device: "eth0"}), false)
		}, want: []writable{{"ml", "train", "node-a"}}},
		{name: "second claim for the same profile and node", event: func() { p.OnAdd(trainB, false) },
			want: []writable{{"ml", "train", "node-a"}}},
		{name: "one of them deleted, the other still runs", event: func() { p.OnDelete(trainB) }, advance: claimMemory,
			want: []writable{{"ml", "train", "node-a"}}},
		{name: "the last one deallocated: remembered for a while", event: func() { p.OnUpdate(trainA, profiledClaim("a", "ml", "train")) },
			want: []writable{{"ml", "train", "node-a"}}},
		{name: "and then forgotten", advance: claimMemory},
		{name: "a claim made again under its name while the watch was down takes the old one's place", event: func() {
			p.OnAdd(profiledClaim("g", "ml", "train", gpuOn("node-b")), false)
			recreated := profiledClaim("g", "ml", "train")
			recreated.UID = "g-again"
			p.OnUpdate(nil, recreated)
		}, advance: claimMemory},
		{name: "a claim deleted while the watch was down is remembered too", event: func() {
			c := profiledClaim("f", "team-b", "infer", gpuOn("node-b"))
			p.OnAdd(c, false)
			p.OnDelete(cache.DeletedFinalStateUnknown{Key: "team-b/f", Obj: c})
		}, advance: claimMemory - time.Second, want: []writable{{"team-b", "infer", "node-b"}}},
	}
	candidates := []writable{{"ml", "train", "node-a"}, {"ml", "train", "node-b"}, {"team-b", "train", "node-a"}, {"ml", "infer", "node-b"}, {"team-b", "infer", "node-b"}}
	for _, step := range steps {
		if step.event != nil {
			step.event()
		}
		now = now.Add(step.advance)
		for _, c := range candidates {
			want := false
			for _, w := range step.want {
				want = want || w == c
			}
			if got := p.Writable(c.namespace, c.profile, c.node); got != want {
				t.Errorf("%s: %v writable %v, want %v", step.name, c, got, want)
			}
		}
	}
}

func TestProfileWriteCheck(t *testing.T) {
	claims := NewProfileClaims()
	claims.OnAdd(profiledClaim("a", "ml", "train", gpuOn("node-a")), true)
	m, err := webhook.NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := New(claims, nil, m)
	if err != nil {
		t.Fatal(err)
	}
	empty := emptyProfile
	pinned := `{"apiVersion":"prism.dev/v1alpha1","kind":"WorkloadProfile","metadata":{"name":"train","namespace":"ml"},"spec":{"minMemory":"1Ti"}}`
	tests := []struct {
		name        string
		node        string // "" for a token without one
		namespace   string
		op          admissionv1.Operation
		subresource string
		object      string
		wantDenied  string
	}{
		{name: "create an empty profile a claim on the node names", node: "node-a", op: admissionv1.Create, object: empty},
		{name: "write status of a profile a claim on the node names", node: "node-a", op: admissionv1.Update, subresource: "status", object: empty},
		{name: "another node", node: "node-b", op: admissionv1.Update, subresource: "status", object: empty,
			wantDenied: "node node-b runs no ResourceClaim in namespace ml annotated prism.dev/profile=train"},
		{name: "another namespace", node: "node-a", namespace: "team-b", op: admissionv1.Update, subresource: "status", object: empty,
			wantDenied: "node node-a runs no ResourceClaim in namespace team-b"},
		{name: "create with a spec", node: "node-a", op: admissionv1.Create, object: pinned,
			wantDenied: "may only create WorkloadProfiles with an empty spec"},
		{name: "update the spec", node: "node-a", op: admissionv1.Update, object: pinned,
			wantDenied: "may only create WorkloadProfiles and update their status, not UPDATE the object"},
		{name: "token without a node", op: admissionv1.Update, subresource: "status", object: empty,
			wantDenied: "the request carries no node name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := tc.namespace
			if ns == "" {
				ns = "ml"
			}
			resp := webhooktest.Call(t, h, pluginWrite(t, tc.node, ns, tc.op, tc.subresource, tc.object))
			switch {
			case tc.wantDenied == "" && !resp.Allowed:
				t.Errorf("denied: %s", resp.Result.Message)
			case tc.wantDenied != "" && (resp.Allowed || !strings.Contains(resp.Result.Message, tc.wantDenied)):
				t.Errorf("allowed %v, result %+v; want denial with %q", resp.Allowed, resp.Result, tc.wantDenied)
			case tc.wantDenied != "" && resp.Result.Code != 403:
				t.Errorf("denied with code %d, want 403", resp.Result.Code)
			}
		})
	}
}

// emptyProfile is the profile the plugin creates, and whose status it
// writes.
const emptyProfile = `{"apiVersion":"prism.dev/v1alpha1","kind":"WorkloadProfile","metadata":{"name":"train","namespace":"ml"}}`

// pluginWrite is the review of the plugin's write of profile train in ns,
// from node ("" for a token without one).
func pluginWrite(t *testing.T, node, ns string, op admissionv1.Operation, subresource, object string) []byte {
	t.Helper()
	user := authenticationv1.UserInfo{Username: "system:serviceaccount:prism:prism-kubelet-plugin"}
	if node != "" {
		user.Extra = map[string]authenticationv1.ExtraValue{NodeNameExtra: {node}}
	}
	body, err := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{
			UID: webhooktest.UID, Kind: webhooktest.ProfileGVK, Operation: op, SubResource: subresource, UserInfo: user,
			Resource:  metav1.GroupVersionResource{Group: "prism.dev", Version: "v1alpha1", Resource: "workloadprofiles"},
			Namespace: ns, Name: "train", Object: runtime.RawExtension{Raw: []byte(object)},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// verdict is what a test compares of the answer to a write.
type verdict struct {
	Allowed    bool
	Code       int32
	RetryAfter int32
}

// TestProfileWriteCheckBeforeClaimsSync: before the claims have synced, a
// write is allowed only where the claims read so far allow it, which the
// whole index does too; any other waits for the whole index and is
// answered from it, or, past its deadline, denied with a retryable error.
// A write is never allowed that the whole index denies.
func TestProfileWriteCheckBeforeClaimsSync(t *testing.T) {
	denied := verdict{Code: 403}
	for _, tc := range []struct {
		name string
		// listed are the claims read before the review, rest those read
		// while it waits; synced: the informer then syncs.
		listed, rest []*resourceapi.ResourceClaim
		synced       bool
		deadline     time.Duration
		want         verdict
		wantWait     bool
	}{
		{name: "writable in the claims read so far: allowed at once", listed: []*resourceapi.ResourceClaim{profiledClaim("a", "ml", "train", gpuOn("node-a"))},
			deadline: time.Minute, want: verdict{Allowed: true}},
		{name: "writable in the whole index: waits, then allowed", rest: []*resourceapi.ResourceClaim{profiledClaim("a", "ml", "train", gpuOn("node-a"))},
			synced: true, deadline: time.Minute, want: verdict{Allowed: true}, wantWait: true},
		{name: "not writable in the whole index: waits, then denied", listed: []*resourceapi.ResourceClaim{profiledClaim("b", "ml", "train", gpuOn("node-b"))},
			rest: []*resourceapi.ResourceClaim{profiledClaim("c", "ml", "serve", gpuOn("node-a"))}, synced: true, deadline: time.Minute, want: denied, wantWait: true},
		{name: "not synced by the deadline: denied, retryable", listed: []*resourceapi.ResourceClaim{profiledClaim("b", "ml", "train", gpuOn("node-b"))},
			deadline: 200 * time.Millisecond, want: verdict{Code: 503, RetryAfter: 1}, wantWait: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := webhook.NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			claims, synced := NewProfileClaims(), webhook.NewSynced("claims", m)
			for _, c := range tc.listed {
				claims.OnAdd(c, true)
			}
			h, err := New(claims, synced, m)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
			defer cancel()
			review := webhooktest.Post(ctx, t, h, pluginWrite(t, "node-a", "ml", admissionv1.Update, "status", emptyProfile))
			if tc.wantWait {
				review.NotAnsweredWithin(50*time.Millisecond, "before the claims synced")
			}
			for _, c := range tc.rest {
				claims.OnAdd(c, true)
			}
			if tc.synced {
				synced.MarkSynced()
			}
			resp := review.Answer()
			got := verdict{Allowed: resp.Allowed}
			if r := resp.Result; r != nil {
				got.Code = r.Code
				if r.Details != nil {
					got.RetryAfter = r.Details.RetryAfterSeconds
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdict (-want +got):\n%s", diff)
			}
		})
	}
}
