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

package webhook

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWaitSynced: a review waits for every part not yet synced, and is
// counted by how its wait ended; past most of its deadline it stops
// waiting, so that it is answered before the API server stops reading.
func TestWaitSynced(t *testing.T) {
	for _, tc := range []struct {
		name string
		// synced: the parts synced before the review; later: those that
		// sync while it waits.
		synced, later []string
		deadline      time.Duration
		wantErr       bool
		// wantWaited counts the reviews that waited, by part and outcome.
		wantWaited map[string]float64
		// wantWithin bounds how long it took; 0: no bound.
		wantWithin time.Duration
	}{
		{name: "every part synced", synced: []string{"claims", "pods"}, deadline: time.Minute, wantWaited: map[string]float64{}},
		{name: "a part syncs while the review waits", synced: []string{"pods"}, later: []string{"claims"}, deadline: time.Minute,
			wantWaited: map[string]float64{"claims/synced": 1}},
		{name: "both sync while it waits", later: []string{"claims", "pods"}, deadline: time.Minute,
			wantWaited: map[string]float64{"claims/synced": 1, "pods/synced": 1}},
		{name: "the deadline comes first", synced: []string{"pods"}, deadline: time.Second, wantErr: true,
			wantWaited: map[string]float64{"claims/deadline": 1}, wantWithin: 950 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := NewMetrics(nil)
			if err != nil {
				t.Fatal(err)
			}
			parts := map[string]*Synced{"claims": NewSynced("claims", m), "pods": NewSynced("pods", m)}
			for _, name := range tc.synced {
				parts[name].MarkSynced()
			}
			ctx, cancel := context.WithTimeout(t.Context(), tc.deadline)
			defer cancel()
			start := time.Now()
			done := make(chan error, 1)
			go func() { done <- WaitSynced(ctx, parts["claims"], parts["pods"], nil) }()
			for _, name := range tc.later {
				select {
				case err := <-done:
					t.Fatalf("returned %v before %s synced", err, name)
				case <-time.After(20 * time.Millisecond):
				}
				parts[name].MarkSynced()
			}
			if err := <-done; (err != nil) != tc.wantErr {
				t.Errorf("error %v, want one: %v", err, tc.wantErr)
			}
			if took := time.Since(start); tc.wantWithin > 0 && took > tc.wantWithin {
				t.Errorf("took %s, want at most %s: the answer would come too late", took, tc.wantWithin)
			}
			got := map[string]float64{}
			for name := range parts {
				for _, outcome := range []string{waitedSynced, waitedDeadline} {
					if n := testutil.ToFloat64(m.waited.WithLabelValues(name, outcome)); n > 0 {
						got[name+"/"+outcome] = n
					}
				}
			}
			if diff := cmp.Diff(tc.wantWaited, got); diff != "" {
				t.Errorf("reviews that waited (-want +got):\n%s", diff)
			}
		})
	}
}
