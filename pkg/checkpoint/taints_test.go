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
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

var lostTaint = Taint{UUID: "GPU-1", Key: "gpu.prism.dev/unhealthy", Value: "gpu-lost", Effect: "NoExecute", TimeAdded: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}

// TestTaintsSurviveARestart: a GPU's health taint is read back by the next
// start, and by another instance's Reload during a rolling update.
func TestTaintsSurviveARestart(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	other, _ := e.open(t)
	mustUpdate(t, s, func(d *Data) error {
		d.Taints = map[string]Taint{"gpu-1": lostTaint}
		return nil
	})
	want := map[string]Taint{"gpu-1": lostTaint}
	reopened, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("checkpoint with taints reported corrupt: %v", rec.Corruption)
	}
	if got := reopened.Taints(); !reflect.DeepEqual(got, want) {
		t.Errorf("taints after reopen = %+v, want %+v", got, want)
	}
	if err := other.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := other.Taints(); !reflect.DeepEqual(got, want) {
		t.Errorf("taints after reload = %+v, want %+v", got, want)
	}
}

// TestCheckpointsWithoutTaintsStillLoad: files written before taints were
// recorded, v1 and v2 alike, load with their claims and no taints.
func TestCheckpointsWithoutTaintsStillLoad(t *testing.T) {
	for _, file := range []string{"v1.json", "v2.json"} {
		t.Run(file, func(t *testing.T) {
			e := newEnv(t)
			raw, err := os.ReadFile(filepath.Join("testdata", file))
			if err != nil {
				t.Fatal(err)
			}
			e.install(t, raw)
			s, rec := e.open(t)
			if rec.Corruption != nil {
				t.Fatalf("%s reported corrupt: %v", file, rec.Corruption)
			}
			if len(s.List()) == 0 {
				t.Error("claims were lost")
			}
			if got := s.Taints(); len(got) != 0 {
				t.Errorf("taints %+v from a file that has none", got)
			}
		})
	}
}

func TestTaintWithoutEffectIsRefused(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	err := s.Update(t.Context(), func(d *Data) error {
		d.Taints = map[string]Taint{"gpu-0": {UUID: "GPU-0", Key: "k"}}
		return nil
	})
	if err == nil {
		t.Error("a taint without an effect was persisted")
	}
}
