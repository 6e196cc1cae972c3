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
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/client-go/tools/record"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/webhooktest"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestLoadWaitsForItsInformers: a claim whose policy reads the load waits
// until the claims and the pods have synced, and is then answered as the
// controller answers it once they have; one whose policy does not read it
// is answered at once; one whose deadline comes first is admitted
// unchanged, and an Event says why.
func TestLoadWaitsForItsInformers(t *testing.T) {
	h100 := rewrite.Model{Name: "NVIDIA H100 80GB HBM3", Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 66900, MemoryBytes: 81559 << 20}
	l40s := rewrite.Model{Name: "NVIDIA L40S", Devices: 8, BandwidthGBps: 864, FP32GFLOPS: 91600, MemoryBytes: 45 << 30}
	fleet := &rewrite.Fleet{Models: []rewrite.Model{h100, l40s}}
	load := &rewrite.Load{Free: map[string]int{h100.Name: 1, l40s.Name: 8}, Pending: []rewrite.Pending{{Devices: 4, BoundType: prismv1alpha1.BoundTypeMemoryBound}}}
	body := webhooktest.ReviewBody(t, admissionv1.Create, webhooktest.ClaimGVK, webhooktest.ReadFixture(t, "claim-profiled.json"))
	for _, tc := range []struct {
		name   string
		policy prismv1alpha1.Policy
		// syncs: the informers sync while the review waits; otherwise
		// they never do.
		syncs    bool
		deadline time.Duration
		wantSkip string
	}{
		{name: "performance reads no load: answered at once", policy: prismv1alpha1.PolicyPerformance, deadline: time.Minute},
		{name: "load-aware waits for the claims and pods", policy: prismv1alpha1.PolicyLoadAware, syncs: true, deadline: time.Minute},
		{name: "load-aware past its deadline", policy: prismv1alpha1.PolicyLoadAware, deadline: 200 * time.Millisecond, wantSkip: skipNotSynced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// synced are the informers Load is read from; none: the
			// controller once they have synced.
			options := func(synced ...*webhook.Synced) (Options, *record.FakeRecorder) {
				m, err := NewMetrics(nil)
				if err != nil {
					t.Fatal(err)
				}
				rec := record.NewFakeRecorder(10)
				return Options{Profiles: fakeReader(t, memoryBound), Policy: tc.policy, Recorder: rec, Metrics: m,
					Fleet: func() *rewrite.Fleet { return fleet }, LoadSynced: synced,
					Load: func() *rewrite.Load {
						for _, s := range synced {
							if !s.HasSynced() {
								t.Errorf("the load was read before the %s synced", s.Name())
							}
						}
						return load
					}}, rec
			}
			wholeOpts, _ := options()
			whole, err := New(wholeOpts)
			if err != nil {
				t.Fatal(err)
			}
			want := webhooktest.Call(t, whole, body)
			if tc.wantSkip != "" {
				want = webhook.Allowed()
			}

			claims, pods := webhook.NewSynced("claims", nil), webhook.NewSynced("pods", nil)
			opts, rec := options(claims, pods)
			h, err := New(opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
			defer cancel()
			review := webhooktest.Post(ctx, t, h, body)
			if tc.syncs {
				for _, s := range []*webhook.Synced{pods, claims} {
					review.NotAnsweredWithin(50*time.Millisecond, "before the "+s.Name()+" synced")
					s.MarkSynced()
				}
			}
			if diff := cmp.Diff(webhooktest.VerdictOf(want), webhooktest.VerdictOf(review.Answer())); diff != "" {
				t.Errorf("answer (-whole view +this one):\n%s", diff)
			}
			if tc.wantSkip == "" {
				return
			}
			if n := testutil.ToFloat64(opts.Metrics.skipped.WithLabelValues(tc.wantSkip)); n != 1 {
				t.Errorf("%s skips counted: %v, want 1", tc.wantSkip, n)
			}
			select {
			case ev := <-rec.Events:
				if !strings.Contains(ev, EventReasonNotRewritten) || !strings.Contains(ev, tc.wantSkip) {
					t.Errorf("event %q, want %s saying %s", ev, EventReasonNotRewritten, tc.wantSkip)
				}
			default:
				t.Error("no Event says why the claim was not rewritten")
			}
		})
	}
}
