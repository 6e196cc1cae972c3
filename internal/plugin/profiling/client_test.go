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

package profiling

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2/ktesting"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestWorkloadProfileClient checks the REST client's requests and that the
// API server's errors keep their kind, which Publish tells apart (not
// found, already exists, conflict).
func TestWorkloadProfileClient(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	const base = "/apis/prism.dev/v1alpha1/namespaces/ml/workloadprofiles"
	gr := schema.GroupResource{Group: "prism.dev", Resource: "workloadprofiles"}
	type call struct{ method, path, kind string }
	var calls []call
	stored := `{"apiVersion":"prism.dev/v1alpha1","kind":"WorkloadProfile","metadata":{"namespace":"ml","name":"train","resourceVersion":"7"},"spec":{"policy":"economy"}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var sent struct{ Kind string }
		_ = json.Unmarshal(body, &sent)
		calls = append(calls, call{r.Method, r.URL.Path, sent.Kind})
		w.Header().Set("Content-Type", "application/json")
		status := func(err *apierrors.StatusError) {
			w.WriteHeader(int(err.ErrStatus.Code))
			st := err.ErrStatus
			st.APIVersion, st.Kind = "v1", "Status"
			_ = json.NewEncoder(w).Encode(st)
		}
		switch {
		case r.Method == http.MethodGet && r.URL.Path == base+"/missing":
			status(apierrors.NewNotFound(gr, "missing"))
		case r.Method == http.MethodGet && r.URL.Path == base+"/train":
			_, _ = io.WriteString(w, stored)
		case r.Method == http.MethodPost && r.URL.Path == base:
			status(apierrors.NewAlreadyExists(gr, "train"))
		case r.Method == http.MethodPut && r.URL.Path == base+"/train/status":
			status(apierrors.NewConflict(gr, "train", nil))
		case r.Method == http.MethodPut && r.URL.Path == base+"/other/status":
			_, _ = w.Write(body)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()

	c, err := NewWorkloadProfileClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "ml", "missing"); !apierrors.IsNotFound(err) {
		t.Errorf("Get of a missing profile: %v, want NotFound", err)
	}
	wp, err := c.Get(ctx, "ml", "train")
	if err != nil || wp.Spec.Policy != prismv1alpha1.PolicyEconomy || wp.ResourceVersion != "7" {
		t.Errorf("Get: %+v, %v; want the stored profile", wp, err)
	}
	if err := c.Create(ctx, wp); !apierrors.IsAlreadyExists(err) {
		t.Errorf("Create of an existing profile: %v, want AlreadyExists", err)
	}
	if err := c.UpdateStatus(ctx, wp); !apierrors.IsConflict(err) {
		t.Errorf("UpdateStatus of a stale profile: %v, want Conflict", err)
	}
	other := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "other"}}
	other.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
	if err := c.UpdateStatus(ctx, other); err != nil || other.Status.BoundType != prismv1alpha1.BoundTypeMemoryBound {
		t.Errorf("UpdateStatus: %+v, %v; want the echoed status", other.Status, err)
	}
	want := []call{
		{http.MethodGet, base + "/missing", ""},
		{http.MethodGet, base + "/train", ""},
		{http.MethodPost, base, "WorkloadProfile"},
		{http.MethodPut, base + "/train/status", "WorkloadProfile"},
		{http.MethodPut, base + "/other/status", "WorkloadProfile"},
	}
	if len(calls) != len(want) {
		t.Fatalf("requests %v, want %v", calls, want)
	}
	for i := range want {
		if calls[i] != want[i] {
			t.Errorf("request %d: %v, want %v", i, calls[i], want[i])
		}
	}
}
