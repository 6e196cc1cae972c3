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
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

func newTestRewriter(t testing.TB, auto bool, reader client.Reader) (http.Handler, *Metrics, *record.FakeRecorder) {
	t.Helper()
	m, err := NewMetrics(nil)
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(10)
	h, err := New(Options{Profiles: reader, Policy: prismv1alpha1.PolicyPerformance, AutoProfile: auto, Recorder: rec, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	return h, m, rec
}

// fakeReader reads profiles.
func fakeReader(t testing.TB, profiles ...*prismv1alpha1.WorkloadProfile) client.WithWatch {
	t.Helper()
	objs := make([]client.Object, 0, len(profiles))
	for _, p := range profiles {
		objs = append(objs, p)
	}
	return webhooktest.Reader(t, objs...)
}

func applyPatch(t *testing.T, object []byte, resp *admissionv1.AdmissionResponse) *resourceapi.ResourceClaim {
	t.Helper()
	return webhooktest.PatchedAs[resourceapi.ResourceClaim](t, object, resp)
}

var (
	memoryBound = webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
		q := resource.MustParse("30Gi")
		wp.Status.PeakMemory = &q
	})
	balanced = webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
		wp.Status.BoundType = prismv1alpha1.BoundTypeBalanced
	})
	unprofiled = webhooktest.Profile("new-job", func(wp *prismv1alpha1.WorkloadProfile) {})
	noAuto     = webhooktest.Profile("new-job", func(wp *prismv1alpha1.WorkloadProfile) { wp.Spec.DisableAutoProfiling = true })
)

func TestRewriter(t *testing.T) {
	tests := []struct {
		name        string
		fixture     string
		op          admissionv1.Operation
		profiles    []*prismv1alpha1.WorkloadProfile
		autoOff     bool
		getErr      error
		wantSkip    string // "" means a patch is expected
		wantEvent   string // prefix of the recorded event, "" for none
		checkResult func(t *testing.T, claim *resourceapi.ResourceClaim)
	}{
		{name: "no annotation", fixture: "claim-plain.json", profiles: []*prismv1alpha1.WorkloadProfile{memoryBound}, wantSkip: skipNoAnnotation},
		{name: "update is not rewritten", fixture: "claim-profiled.json", op: admissionv1.Update, profiles: []*prismv1alpha1.WorkloadProfile{memoryBound}, wantSkip: skipUnsupported},
		{
			name: "memory-bound profile", fixture: "claim-profiled.json", profiles: []*prismv1alpha1.WorkloadProfile{memoryBound},
			wantEvent: "Normal Rewritten profile train (MemoryBound, performance): gpu -> firstAvailable [ultra, high, fits]; hard needs memory>=39Gi",
			checkResult: func(t *testing.T, claim *resourceapi.ResourceClaim) {
				gpu := claim.Spec.Devices.Requests[0]
				if gpu.Exactly != nil || len(gpu.FirstAvailable) != 3 {
					t.Fatalf("gpu request not rewritten: %+v", gpu)
				}
				var names []string
				for _, s := range gpu.FirstAvailable {
					names = append(names, s.Name)
					// The user's selector is kept in every alternative.
					last := s.Selectors[len(s.Selectors)-1]
					if !strings.Contains(last.CEL.Expression, "GeForce") {
						t.Errorf("subrequest %s lost the user's selector: %+v", s.Name, s.Selectors)
					}
				}
				if !slices.Equal(names, []string{"ultra", "high", "fits"}) {
					t.Errorf("alternatives %v", names)
				}
				if nic := claim.Spec.Devices.Requests[1]; nic.Exactly == nil || nic.Exactly.DeviceClassName != "nic.example.com" {
					t.Errorf("nic request changed: %+v", nic)
				}
				var plan rewrite.Plan
				if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
					t.Fatalf("rewrite annotation: %v", err)
				}
				if plan.Profile != "train" || plan.BoundType != prismv1alpha1.BoundTypeMemoryBound || !slices.Equal(plan.Rewritten, []string{"gpu"}) {
					t.Errorf("plan %+v", plan)
				}
			},
		},
		{
			name: "profile policy overrides the cluster policy", fixture: "claim-profiled.json",
			profiles: []*prismv1alpha1.WorkloadProfile{webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
				wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
				wp.Spec.Policy = prismv1alpha1.PolicyEconomy
			})},
			wantEvent: "Normal Rewritten profile train (MemoryBound, economy): gpu -> firstAvailable [high, fits]",
			checkResult: func(t *testing.T, claim *resourceapi.ResourceClaim) {
				if n := len(claim.Spec.Devices.Requests[0].FirstAvailable); n != 2 {
					t.Errorf("economy ladder has %d alternatives, want 2", n)
				}
			},
		},
		{
			name: "unknown profile is profiled", fixture: "claim-unknown-profile.json",
			wantEvent: "Normal ProfilingRequested profile not found: this run is profiled; profiling enabled for gpu, pick/big",
			checkResult: func(t *testing.T, claim *resourceapi.ResourceClaim) {
				configs := claim.Spec.Devices.Config
				if len(configs) != 1 {
					t.Fatalf("configs: %+v", configs)
				}
				c := configs[0]
				if !slices.Equal(c.Requests, []string{"gpu", "pick/big"}) || c.Opaque == nil || c.Opaque.Driver != "gpu.prism.dev" {
					t.Errorf("config %+v", c)
				}
				cfg, err := gpuv1alpha1.Decode(c.Opaque.Parameters.Raw)
				if err != nil {
					t.Fatalf("the kubelet plugin would reject the config: %v", err)
				}
				if cfg.Profiling == nil || !cfg.Profiling.Enabled {
					t.Errorf("profiling not enabled: %+v", cfg.Profiling)
				}
				want := `{"profile":"new-job","action":"profile","reason":"profile not found: this run is profiled"}`
				if got := claim.Annotations[rewrite.AnnotationKey]; got != want {
					t.Errorf("annotation %s, want %s", got, want)
				}
			},
		},
		{
			name: "profile without status is profiled", fixture: "claim-unknown-profile.json", profiles: []*prismv1alpha1.WorkloadProfile{unprofiled},
			wantEvent: "Normal ProfilingRequested profile has no measurements yet",
			checkResult: func(t *testing.T, claim *resourceapi.ResourceClaim) {
				if len(claim.Spec.Devices.Config) != 1 {
					t.Errorf("configs: %+v", claim.Spec.Devices.Config)
				}
			},
		},
		{
			name: "user GpuConfig is not overridden", fixture: "claim-configured.json",
			checkResult: nil, wantSkip: skipGPUConfigPresent, wantEvent: "Normal NotRewritten gpu-config-present",
		},
		{
			name: "profiling config is appended to other drivers' configs", fixture: "claim-nic-config.json",
			wantEvent: "Normal ProfilingRequested",
			checkResult: func(t *testing.T, claim *resourceapi.ResourceClaim) {
				configs := claim.Spec.Devices.Config
				if len(configs) != 2 || configs[0].Opaque.Driver != "nic.example.com" || configs[1].Opaque.Driver != "gpu.prism.dev" {
					t.Errorf("configs: %+v", configs)
				}
			},
		},
		{name: "claim opt-out", fixture: "claim-opt-out.json", wantSkip: skipOptOut, wantEvent: "Normal NotRewritten auto-profile-opt-out"},
		{name: "profile opt-out", fixture: "claim-unknown-profile.json", profiles: []*prismv1alpha1.WorkloadProfile{noAuto}, wantSkip: skipProfileDisablesAuto},
		{name: "auto-profiling off", fixture: "claim-unknown-profile.json", autoOff: true, wantSkip: skipNotFoundAutoOff},
		{name: "auto-profiling off, no status", fixture: "claim-unknown-profile.json", autoOff: true, profiles: []*prismv1alpha1.WorkloadProfile{unprofiled}, wantSkip: skipNotProfiledAutoOff},
		{name: "balanced", fixture: "claim-profiled.json", profiles: []*prismv1alpha1.WorkloadProfile{balanced}, wantSkip: skipBalancedUnknown},
		{name: "not a GPU claim", fixture: "claim-not-gpu.json", profiles: []*prismv1alpha1.WorkloadProfile{memoryBound}, wantSkip: skipNotGPU},
		{name: "profile name is not a name", fixture: "claim-bad-name.json", wantSkip: skipInvalidProfileName},
		{name: "lookup error", fixture: "claim-profiled.json", getErr: errors.New("cache not synced"), wantSkip: skipLookupError},
		{name: "memory above every bucket", fixture: "claim-profiled.json", wantSkip: skipInvalidProfile,
			profiles: []*prismv1alpha1.WorkloadProfile{webhooktest.Profile("train", func(wp *prismv1alpha1.WorkloadProfile) {
				wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
				q := resource.MustParse("200Gi")
				wp.Spec.MinMemory = &q
			})}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var reader client.Reader = fakeReader(t, tc.profiles...)
			if tc.getErr != nil {
				reader = interceptor.NewClient(fakeReader(t), interceptor.Funcs{
					Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
						return tc.getErr
					},
				})
			}
			h, m, events := newTestRewriter(t, !tc.autoOff, reader)
			op := tc.op
			if op == "" {
				op = admissionv1.Create
			}
			object := webhooktest.ReadFixture(t, tc.fixture)
			resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, op, webhooktest.ClaimGVK, object))
			if !resp.Allowed {
				t.Fatalf("claim denied: %+v", resp.Result)
			}

			if tc.wantSkip != "" {
				if resp.Patch != nil || resp.PatchType != nil {
					t.Errorf("skip %s returned a patch: %s", tc.wantSkip, resp.Patch)
				}
				if got := testutil.ToFloat64(m.skipped.WithLabelValues(tc.wantSkip)); got != 1 {
					t.Errorf("skip counter %s = %v, want 1", tc.wantSkip, got)
				}
			} else {
				claim := applyPatch(t, object, resp)
				if tc.checkResult != nil {
					tc.checkResult(t, claim)
				}
			}

			if tc.wantEvent == "" && tc.wantSkip != "" && tc.wantSkip != skipNoAnnotation && tc.wantSkip != skipUnsupported {
				tc.wantEvent = "Normal NotRewritten " + tc.wantSkip + ": "
				if warningSkips[tc.wantSkip] {
					tc.wantEvent = "Warning NotRewritten " + tc.wantSkip + ": "
				}
			}
			select {
			case e := <-events.Events:
				if tc.wantEvent == "" || !strings.HasPrefix(e, tc.wantEvent) {
					t.Errorf("event %q, want prefix %q", e, tc.wantEvent)
				}
			default:
				if tc.wantEvent != "" {
					t.Errorf("no event, want %q", tc.wantEvent)
				}
			}
		})
	}
}

// TestRewriterHostileProfile feeds profiles whose fields try to smuggle CEL
// into the selectors. The CRD schema would reject most of them, but the
// webhook must not depend on the CRD being current.
func TestRewriterHostileProfile(t *testing.T) {
	huge := resource.MustParse("9223372036854775807")
	negative := resource.MustParse("-1")
	hugeExponent := resource.MustParse("1E1111011110") // issue 31
	tests := map[string]func(*prismv1alpha1.WorkloadProfile){
		"bound type with CEL": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = `MemoryBound" || device.driver == "x`
		},
		"bound type with operators": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = "MemoryBound || true"
		},
		"policy with quotes": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeComputeBound
			wp.Spec.Policy = `performance") || true || ("`
		},
		"compute capability with CEL": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
			wp.Spec.MinComputeCapability = `8.0.0")) >= 0 || device.attributes["gpu.prism.dev"].x == ("`
		},
		"huge memory": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
			wp.Status.PeakMemory = &huge
		},
		"memory with a huge exponent": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeMemoryBound
			wp.Status.PeakMemory = &hugeExponent
		},
		"negative memory": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeLatencyBound
			wp.Spec.MinMemory = &negative
		},
		"valid but extreme": func(wp *prismv1alpha1.WorkloadProfile) {
			wp.Status.BoundType = prismv1alpha1.BoundTypeComputeBound
			q := resource.MustParse("139Gi")
			wp.Spec.MinMemory = &q
			wp.Spec.MinComputeCapability = "10.0"
		},
	}
	object := webhooktest.ReadFixture(t, "claim-profiled.json")
	orig := &resourceapi.ResourceClaim{}
	if err := json.Unmarshal(object, orig); err != nil {
		t.Fatal(err)
	}
	userSelectors := map[string]bool{}
	for _, s := range orig.Spec.Devices.Requests[0].Exactly.Selectors {
		userSelectors[s.CEL.Expression] = true
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			h, _, _ := newTestRewriter(t, true, fakeReader(t, webhooktest.Profile("train", mutate)))
			resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object))
			if !resp.Allowed {
				t.Fatalf("claim denied: %+v", resp.Result)
			}
			if resp.Patch == nil {
				return
			}
			claim := applyPatch(t, object, resp)
			forEachSelector(&claim.Spec, func(s resourceapi.DeviceSelector) string {
				if s.CEL == nil {
					t.Errorf("non-CEL selector: %+v", s)
					return ""
				}
				if _, generated := rewrite.Conjuncts(s.CEL.Expression); !generated && !userSelectors[s.CEL.Expression] {
					t.Errorf("selector outside the catalogue: %+v", s.CEL)
				}
				return ""
			})
		})
	}
}

func TestForeignSelector(t *testing.T) {
	sel := func(exprs ...string) []resourceapi.DeviceSelector {
		var out []resourceapi.DeviceSelector
		for _, e := range exprs {
			out = append(out, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
		}
		return out
	}
	spec := func(subs ...[]resourceapi.DeviceSelector) *resourceapi.ResourceClaimSpec {
		r := resourceapi.DeviceRequest{Name: "gpu"}
		for i, s := range subs {
			r.FirstAvailable = append(r.FirstAvailable, resourceapi.DeviceSubRequest{Name: string(rune('a' + i)), Selectors: s})
		}
		return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{r}}}
	}
	user := "device.driver == \"gpu.prism.dev\""
	orig := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{Selectors: sel(user)},
	}}}}
	cat := rewrite.Catalogue()
	tests := []struct {
		name string
		out  *resourceapi.ResourceClaimSpec
		want string
	}{
		{"catalogue and user", spec(sel(cat[0], user), sel(user)), ""},
		{"catalogue entries joined", spec(sel("("+cat[0]+") && ("+cat[7]+")", user)), ""},
		{"a user's test joined to an entry", spec(sel("(" + cat[0] + ") && (" + user + ")")), "(" + cat[0] + ") && (" + user + ")"},
		{"injected", spec(sel(cat[0], user), sel(user+" || true")), user + " || true"},
		{"non-CEL", spec([]resourceapi.DeviceSelector{{}}), "<non-CEL selector>"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := foreignSelector(orig, tc.out); got != tc.want {
				t.Errorf("foreignSelector = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestRewriterHTTPErrors(t *testing.T) {
	h, _, _ := newTestRewriter(t, true, fakeReader(t))
	tests := []struct {
		name, method, contentType, body string
		want                            int
	}{
		{"GET", http.MethodGet, "application/json", "", http.StatusMethodNotAllowed},
		{"wrong content type", http.MethodPost, "text/plain", "{}", http.StatusUnsupportedMediaType},
		{"not JSON", http.MethodPost, "application/json", "{", http.StatusBadRequest},
		{"no request", http.MethodPost, "application/json", `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}`, http.StatusBadRequest},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(tc.method, "/", strings.NewReader(tc.body))
			req.Header.Set("Content-Type", tc.contentType)
			h.ServeHTTP(rec, req)
			if rec.Code != tc.want {
				t.Errorf("status %d, want %d", rec.Code, tc.want)
			}
		})
	}
}

// A claim generated from a pod's template has no name at mutating admission,
// so the explanation goes to the pod that owns it.
func TestUnnamedGeneratedClaimExplainsOnItsPod(t *testing.T) {
	h, _, rec := newTestRewriter(t, true, fakeReader(t, memoryBound))
	var claim map[string]any
	if err := json.Unmarshal(webhooktest.ReadFixture(t, "claim-profiled.json"), &claim); err != nil {
		t.Fatal(err)
	}
	meta := claim["metadata"].(map[string]any)
	delete(meta, "name")
	meta["generateName"] = "trainer-0-gpu-"
	meta["ownerReferences"] = []any{map[string]any{"apiVersion": "v1", "kind": "Pod", "name": "trainer-0", "uid": "pod-uid", "controller": true}}
	object, err := json.Marshal(claim)
	if err != nil {
		t.Fatal(err)
	}
	resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"}, object))
	if !resp.Allowed || len(resp.Patch) == 0 {
		t.Fatalf("claim not rewritten: %+v", resp)
	}
	select {
	case ev := <-rec.Events:
		if !strings.Contains(ev, "Rewritten") || !strings.Contains(ev, "claim for pod trainer-0") {
			t.Errorf("event %q does not explain the rewrite on the pod", ev)
		}
	default:
		t.Error("no event recorded for an unnamed claim")
	}
}

// The webhooks declare sideEffects: None, so a server-side dry run gets the
// same answer as a real request but leaves no Event.
func TestDryRunRecordsNoEvents(t *testing.T) {
	tests := []struct {
		name      string
		profiles  []*prismv1alpha1.WorkloadProfile
		wantPatch bool
	}{
		{name: "rewritten", profiles: []*prismv1alpha1.WorkloadProfile{memoryBound}, wantPatch: true},
		{name: "skipped: balanced profile", profiles: []*prismv1alpha1.WorkloadProfile{balanced}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, _, rec := newTestRewriter(t, true, fakeReader(t, tc.profiles...))
			var review admissionv1.AdmissionReview
			if err := json.Unmarshal(webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, webhooktest.ReadFixture(t, "claim-profiled.json")), &review); err != nil {
				t.Fatal(err)
			}
			review.Request.DryRun = ptr.To(true)
			body, err := json.Marshal(review)
			if err != nil {
				t.Fatal(err)
			}
			resp := webhooktest.Call(t, h, body)
			if !resp.Allowed || (len(resp.Patch) > 0) != tc.wantPatch {
				t.Fatalf("response %+v, want patch: %v", resp, tc.wantPatch)
			}
			select {
			case ev := <-rec.Events:
				t.Errorf("dry run recorded event %q", ev)
			default:
			}
		})
	}
}

// TestInvalidProfileNameEventIsBounded: the Warning Event about an invalid
// prism.dev/profile quotes at most 64 bytes of it and says its length,
// whether it goes on the claim or, for a claim made from a pod's template,
// on the pod. The whole value, up to the API's 256 KiB of annotations,
// once went into the Event.
func TestInvalidProfileNameEventIsBounded(t *testing.T) {
	const maxEvent = 512
	huge := strings.Repeat("p", 200<<10)
	for _, tc := range []struct {
		name, profile string
		fromTemplate  bool
		want          string // prefix of the Event
	}{
		{
			name: "upper case", profile: "Train",
			want: `Warning NotRewritten invalid-profile-name: prism.dev/profile "Train" is not a WorkloadProfile name: a lowercase RFC 1123 subdomain`,
		},
		{
			name: "200 KiB", profile: huge,
			want: `Warning NotRewritten invalid-profile-name: prism.dev/profile "` + huge[:64] + `"... (204800 bytes) is not a WorkloadProfile name: must be no more than 253 characters`,
		},
		{
			name: "200 KiB on a claim of a pod", profile: huge, fromTemplate: true,
			want: `Warning NotRewritten claim for pod trainer-0: invalid-profile-name: prism.dev/profile "` + huge[:64] + `"... (204800 bytes)`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: webhooktest.Namespace, Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: tc.profile}},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
					Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName},
				}}}},
			}
			if tc.fromTemplate {
				claim.Name = ""
				claim.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "trainer-0", UID: "pod-uid", Controller: ptr.To(true)}}
			}
			object, err := json.Marshal(claim)
			if err != nil {
				t.Fatal(err)
			}
			h, m, events := newTestRewriter(t, true, fakeReader(t))
			resp := webhooktest.Call(t, h, webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, object))
			if !resp.Allowed || resp.Patch != nil {
				t.Fatalf("claim denied or patched: %+v", resp)
			}
			if got := testutil.ToFloat64(m.skipped.WithLabelValues(skipInvalidProfileName)); got != 1 {
				t.Errorf("skip counter %s = %v, want 1", skipInvalidProfileName, got)
			}
			select {
			case e := <-events.Events:
				if !strings.HasPrefix(e, tc.want) {
					t.Errorf("event %.600q, want prefix %q", e, tc.want)
				}
				if len(e) > maxEvent {
					t.Errorf("event of %d bytes, want at most %d", len(e), maxEvent)
				}
			default:
				t.Errorf("no event, want %q", tc.want)
			}
		})
	}
}
