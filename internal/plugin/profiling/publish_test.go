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
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/pkg/profile"
)

func TestPublish(t *testing.T) {
	claim := prismv1alpha1.ClaimReference{Namespace: "ml", Name: "train-gpu", UID: testClaimUID}
	earlier := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	sm := int32(50000)
	existing := func(mod func(*prismv1alpha1.WorkloadProfile)) *prismv1alpha1.WorkloadProfile {
		wp := &prismv1alpha1.WorkloadProfile{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ml", Name: "train", Generation: 3},
			Spec:       prismv1alpha1.WorkloadProfileSpec{Policy: prismv1alpha1.PolicyEconomy},
			Status: prismv1alpha1.WorkloadProfileStatus{
				BoundType: prismv1alpha1.BoundTypeComputeBound, SMThroughputMilliPercent: &sm, ObservedAt: &earlier,
				Conditions: []metav1.Condition{{Type: prismv1alpha1.ConditionProfiled, Status: metav1.ConditionTrue,
					Reason: prismv1alpha1.ReasonReportParsed, LastTransitionTime: earlier}},
			},
		}
		if mod != nil {
			mod(wp)
		}
		return wp
	}

	tests := map[string]struct {
		objects   []client.Object
		report    string // fixture
		err       error
		conflicts int

		wantBound  prismv1alpha1.BoundType
		wantStatus metav1.ConditionStatus
		wantReason string
		wantPolicy prismv1alpha1.Policy
		wantErr    bool
	}{
		"creates the profile": {
			report:     "vectoradd_raw.csv",
			wantBound:  prismv1alpha1.BoundTypeMemoryBound,
			wantStatus: metav1.ConditionTrue,
			wantReason: prismv1alpha1.ReasonReportParsed,
		},
		"updates an existing profile and keeps its spec": {
			objects:    []client.Object{existing(nil)},
			report:     "tinygrid_raw.csv",
			wantBound:  prismv1alpha1.BoundTypeLatencyBound,
			wantStatus: metav1.ConditionTrue,
			wantReason: prismv1alpha1.ReasonReportParsed,
			wantPolicy: prismv1alpha1.PolicyEconomy,
		},
		"retries on conflict": {
			objects:    []client.Object{existing(nil)},
			report:     "fmaloop_raw.csv",
			conflicts:  2,
			wantBound:  prismv1alpha1.BoundTypeComputeBound,
			wantStatus: metav1.ConditionTrue,
			wantReason: prismv1alpha1.ReasonReportParsed,
			wantPolicy: prismv1alpha1.PolicyEconomy,
		},
		"gives up after too many conflicts": {
			objects:   []client.Object{existing(nil)},
			report:    "fmaloop_raw.csv",
			conflicts: 100,
			wantErr:   true,
		},
		"collect error becomes a condition": {
			objects:    []client.Object{existing(nil)},
			err:        &CollectError{Reason: ReasonProfilerFailed, Detail: "ncu failed: ERR_NVGPUCTRPERM"},
			wantBound:  prismv1alpha1.BoundTypeComputeBound, // the earlier figures stay
			wantStatus: metav1.ConditionFalse,
			wantReason: string(ReasonProfilerFailed),
			wantPolicy: prismv1alpha1.PolicyEconomy,
		},
		"unparseable report becomes a condition": {
			report:     "garbled.csv",
			wantStatus: metav1.ConditionFalse,
			wantReason: string(ReasonReportUnparseable),
		},
		"auto-profiling disabled": {
			objects: []client.Object{existing(func(wp *prismv1alpha1.WorkloadProfile) {
				wp.Spec.DisableAutoProfiling = true
			})},
			report:     "vectoradd_raw.csv",
			wantBound:  prismv1alpha1.BoundTypeComputeBound,
			wantStatus: metav1.ConditionTrue,
			wantReason: prismv1alpha1.ReasonReportParsed,
			wantPolicy: prismv1alpha1.PolicyEconomy,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			scheme := runtime.NewScheme()
			if err := prismv1alpha1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			conflicts := tc.conflicts
			c := fake.NewClientBuilder().WithScheme(scheme).
				WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).
				WithObjects(tc.objects...).
				WithInterceptorFuncs(interceptor.Funcs{
					SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
						if conflicts > 0 {
							conflicts--
							return apierrors.NewConflict(schema.GroupResource{Group: "prism.dev", Resource: "workloadprofiles"}, obj.GetName(), errors.New("modified"))
						}
						return c.SubResource(sub).Update(ctx, obj, opts...)
					},
				}).Build()

			var collected *prismv1alpha1.WorkloadProfileStatus
			collectErr := tc.err
			if tc.report != "" {
				collected, collectErr = collectFixture(ctx, t, tc.report, claim)
			}
			err := NewPublisher(profilingtest.WorkloadProfiles(c)).Publish(ctx, Result{Claim: claim, Profile: "train", Status: collected, Err: collectErr})
			if tc.wantErr {
				if err == nil || !apierrors.IsConflict(errors.Unwrap(err)) {
					t.Fatalf("Publish: got %v, want a conflict error", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Publish: %v", err)
			}
			var wp prismv1alpha1.WorkloadProfile
			if err := c.Get(ctx, client.ObjectKey{Namespace: "ml", Name: "train"}, &wp); err != nil {
				t.Fatal(err)
			}
			if wp.Status.BoundType != tc.wantBound {
				t.Errorf("boundType %q, want %q", wp.Status.BoundType, tc.wantBound)
			}
			if wp.Spec.Policy != tc.wantPolicy {
				t.Errorf("spec.policy %q, want %q: the spec is the user's", wp.Spec.Policy, tc.wantPolicy)
			}
			cond := meta.FindStatusCondition(wp.Status.Conditions, prismv1alpha1.ConditionProfiled)
			if cond == nil || cond.Status != tc.wantStatus || cond.Reason != tc.wantReason {
				t.Fatalf("Profiled condition %+v, want %s/%s", cond, tc.wantStatus, tc.wantReason)
			}
			if cond.Status == metav1.ConditionFalse && cond.ObservedGeneration != wp.Generation {
				t.Errorf("observedGeneration %d, want %d", cond.ObservedGeneration, wp.Generation)
			}
			if tc.report != "" {
				// The report is the tenant's: none of it goes into a message.
				for _, field := range strings.FieldsFunc(string(fixture(t, tc.report)), func(r rune) bool { return r == '\n' || r == ',' }) {
					if len(field) > 8 && strings.Contains(cond.Message, field) {
						t.Errorf("condition message %q quotes the report: %q", cond.Message, field)
					}
				}
			}
			if tc.wantStatus == metav1.ConditionTrue && tc.wantPolicy == "" {
				data := fixture(t, tc.report)
				want := prismv1alpha1.ReportDigest{File: ReportFile, SHA256: fmt.Sprintf("%x", sha256.Sum256(data)), SizeBytes: int64(len(data))}
				if wp.Status.Report == nil || *wp.Status.Report != want {
					t.Errorf("status.report %+v, want %+v", wp.Status.Report, want)
				}
			}
			if tc.wantStatus == metav1.ConditionTrue && tc.wantReason == prismv1alpha1.ReasonReportParsed && tc.wantBound != prismv1alpha1.BoundTypeComputeBound {
				if src := wp.Status.Source; src == nil || src.ResourceClaim == nil || src.ResourceClaim.UID != testClaimUID {
					t.Errorf("status.source %+v, want the claim", src)
				}
			}
		})
	}
}

// collectFixture collects a recorded report as the plugin does, from a
// claim directory that holds it as report.csv.
func collectFixture(ctx context.Context, t *testing.T, name string, claim prismv1alpha1.ClaimReference) (*prismv1alpha1.WorkloadProfileStatus, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "claim")
	if err := os.MkdirAll(filepath.Join(dir, outDir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, outDir, ReportFile), fixture(t, name), 0o644); err != nil {
		t.Fatal(err)
	}
	return Collect(ctx, dir, profile.Options{Source: &prismv1alpha1.ProfileSource{Type: prismv1alpha1.ProfileSourceResourceClaim, ResourceClaim: &claim}})
}

// TestPublishRefusesAnInvalidName: a name no WorkloadProfile could have is
// refused before any request, in an error that quotes at most 64 bytes of
// it, so that the caller's retries neither call the API nor log the value.
func TestPublishRefusesAnInvalidName(t *testing.T) {
	for name, profile := range map[string]string{
		"none":       "",
		"upper case": "Train",
		"200 KiB":    strings.Repeat("p", 200<<10),
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			scheme := runtime.NewScheme()
			if err := prismv1alpha1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			requests := 0
			c := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).
				WithInterceptorFuncs(interceptor.Funcs{
					Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
						requests++
						return c.Get(ctx, key, obj, opts...)
					},
					Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
						requests++
						return c.Create(ctx, obj, opts...)
					},
				}).Build()
			claim := prismv1alpha1.ClaimReference{Namespace: "ml", Name: "train-gpu", UID: testClaimUID}
			err := NewPublisher(profilingtest.WorkloadProfiles(c)).Publish(ctx, Result{Claim: claim, Profile: profile, Err: errors.New("no report")})
			if err == nil || len(err.Error()) > 512 {
				t.Errorf("Publish error of %d bytes, want an error of at most 512: %.600v", len(fmt.Sprint(err)), err)
			}
			if requests != 0 {
				t.Errorf("%d API requests, want none", requests)
			}
		})
	}
}
