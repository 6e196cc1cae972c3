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
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
)

// TestUpdateStatus: the one status writer creates a missing profile with
// an empty spec, keeps an existing one's spec, writes what update set
// (again after a conflict) and nothing where update declines.
func TestUpdateStatus(t *testing.T) {
	key := types.NamespacedName{Namespace: "ml", Name: "train"}
	existing := &prismv1alpha1.WorkloadProfile{
		ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name},
		Spec:       prismv1alpha1.WorkloadProfileSpec{Policy: prismv1alpha1.PolicyEconomy},
	}
	for name, tc := range map[string]struct {
		objects   []client.Object
		conflicts int
		declines  bool
		getErr    error

		wantSpec   prismv1alpha1.WorkloadProfileSpec
		wantRuns   *int32
		wantWrites int
		wantErr    bool
	}{
		"creates a missing profile": {wantRuns: ptr.To[int32](1), wantWrites: 1},
		"keeps an existing spec": {
			objects: []client.Object{existing.DeepCopy()}, wantSpec: existing.Spec, wantRuns: ptr.To[int32](1), wantWrites: 1,
		},
		"writes again after a conflict": {
			objects: []client.Object{existing.DeepCopy()}, conflicts: 2, wantSpec: existing.Spec, wantRuns: ptr.To[int32](1), wantWrites: 3,
		},
		"writes nothing where update declines": {
			objects: []client.Object{existing.DeepCopy()}, declines: true, wantSpec: existing.Spec,
		},
		"reports a failed read": {getErr: errors.New("connection refused"), wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			scheme := runtime.NewScheme()
			if err := prismv1alpha1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			conflicts, writes := tc.conflicts, 0
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).
				WithObjects(tc.objects...).
				WithInterceptorFuncs(interceptor.Funcs{
					Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						if tc.getErr != nil {
							return tc.getErr
						}
						return c.Get(ctx, key, obj, opts...)
					},
					SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
						writes++
						if conflicts > 0 {
							conflicts--
							return apierrors.NewConflict(schema.GroupResource{Group: "prism.dev", Resource: "workloadprofiles"}, obj.GetName(), errors.New("modified"))
						}
						return c.SubResource(sub).Update(ctx, obj, opts...)
					},
				}).Build()
			err := UpdateStatus(ctx, profilingtest.WorkloadProfiles(c), key, func(wp *prismv1alpha1.WorkloadProfile) bool {
				wp.Status.Usage = &prismv1alpha1.UsageProfile{Runs: 1}
				return !tc.declines
			})
			if gotErr := err != nil; gotErr != tc.wantErr {
				t.Fatalf("UpdateStatus: %v, want an error: %t", err, tc.wantErr)
			}
			if writes != tc.wantWrites {
				t.Errorf("%d status writes, want %d", writes, tc.wantWrites)
			}
			if tc.wantErr {
				return
			}
			var wp prismv1alpha1.WorkloadProfile
			if err := c.Get(ctx, key, &wp); err != nil {
				t.Fatal(err)
			}
			var gotRuns *int32
			if wp.Status.Usage != nil {
				gotRuns = &wp.Status.Usage.Runs
			}
			if diff := cmp.Diff(tc.wantRuns, gotRuns); diff != "" {
				t.Errorf("status.usage.runs (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSpec, wp.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
		})
	}
}
