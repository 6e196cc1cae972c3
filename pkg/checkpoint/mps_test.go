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

package checkpoint

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var mpsDaemon = MPSDaemon{UUID: "GPU-1", PipeDir: "/var/lib/prism/mps/GPU-1/pipe", LogDir: "/var/lib/prism/mps/GPU-1/log",
	PID: 4242, StartTicks: 987654, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}

// TestMPSDaemonsSurviveRestartAndClaimChanges: a daemon record is read back
// by the next start and by another instance's Reload, and a claim change
// appended to the journal after it, or one that rewrites the file, keeps it.
func TestMPSDaemonsSurviveRestartAndClaimChanges(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	other, _ := e.open(t)
	mustUpdate(t, s, func(d *Data) error {
		d.MPSDaemons = map[string]MPSDaemon{"GPU-1": mpsDaemon}
		return nil
	})
	claim := Claim{UID: "uid-1", Namespace: "ns", Name: "c", State: PrepareCompleted}
	for range 2 {
		if err := s.PutClaims(t.Context(), true, claim); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]MPSDaemon{"GPU-1": mpsDaemon}
	reopened, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("checkpoint with an MPS daemon reported corrupt: %v", rec.Corruption)
	}
	if diff := cmp.Diff(want, reopened.MPSDaemons()); diff != "" {
		t.Errorf("MPS daemons after reopen (-want +got):\n%s", diff)
	}
	if err := other.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, other.MPSDaemons()); diff != "" {
		t.Errorf("MPS daemons after reload (-want +got):\n%s", diff)
	}
}

func TestMPSDaemonWithoutPipeDirIsRefused(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	err := s.Update(t.Context(), func(d *Data) error {
		d.MPSDaemons = map[string]MPSDaemon{"GPU-1": {UUID: "GPU-1", LogDir: "/log"}}
		return nil
	})
	if err == nil {
		t.Fatal("a daemon record without a pipe directory was persisted")
	}
	if got := s.MPSDaemons(); len(got) != 0 {
		t.Errorf("store kept %+v after the refused update", got)
	}
}
