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
	"encoding/json"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/fleet"
	"github.com/prismgpu/prism/pkg/webhook"
	"github.com/prismgpu/prism/pkg/webhook/webhooktest"
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
	h, err := New(claims, m)
	if err != nil {
		t.Fatal(err)
	}
	empty := `{"apiVersion":"prism.dev/v1alpha1","kind":"WorkloadProfile","metadata":{"name":"train","namespace":"ml"}}`
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
			user := authenticationv1.UserInfo{Username: "system:serviceaccount:prism:prism-kubelet-plugin"}
			if tc.node != "" {
				user.Extra = map[string]authenticationv1.ExtraValue{NodeNameExtra: {tc.node}}
			}
			body, err := json.Marshal(admissionv1.AdmissionReview{
				TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
				Request: &admissionv1.AdmissionRequest{
					UID: webhooktest.UID, Kind: webhooktest.ProfileGVK, Operation: tc.op, SubResource: tc.subresource, UserInfo: user,
					Resource:  metav1.GroupVersionResource{Group: "prism.dev", Version: "v1alpha1", Resource: "workloadprofiles"},
					Namespace: ns, Name: "train", Object: runtime.RawExtension{Raw: []byte(tc.object)},
				},
			})
			if err != nil {
				t.Fatal(err)
			}
			resp := webhooktest.Call(t, h, body)
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
