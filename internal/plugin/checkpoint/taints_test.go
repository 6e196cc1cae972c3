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
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

var (
	lostTaint = Taint{UUID: "GPU-1", Key: "gpu.prism.dev/unhealthy", Value: "gpu-lost", Effect: "NoExecute", TimeAdded: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	mpsDaemon = MPSDaemon{UUID: "GPU-1", PipeDir: "/var/lib/prism/mps/GPU-1/pipe", LogDir: "/var/lib/prism/mps/GPU-1/log",
		PID: 4242, StartTicks: 987654, Started: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	// shareDaemon is a share's own daemon, with its limits and /dev/shm.
	shareDaemon = MPSDaemon{UUID: "GPU-1", PipeDir: "/var/lib/prism/mps/uid-1-gpu-0/pipe", LogDir: "/var/lib/prism/mps/uid-1-gpu-0/log",
		ShmDir: "/var/lib/prism/mps/uid-1-gpu-0/shm", Limits: gpuv1alpha1.Share{ComputePercent: 40, MemoryBytes: 8 << 30},
		PID: 4243, StartTicks: 987655, Started: time.Date(2026, 1, 2, 3, 4, 6, 0, time.UTC)}
)

// gpuRecords is what the checkpoint keeps about GPUs rather than claims.
type gpuRecords struct {
	Taints     map[string]Taint
	MPSDaemons map[string]MPSDaemon
}

func gpuRecordsOf(s *Store) gpuRecords {
	return gpuRecords{Taints: s.Taints(), MPSDaemons: s.MPSDaemons()}
}

// TestGPURecordsSurviveRestartAndClaimChanges: a GPU's health taint and its
// MPS daemon are read back by the next start and by another instance's
// Reload during a rolling update, and a claim change appended to the
// journal after them, or one that rewrites the file, keeps them.
func TestGPURecordsSurviveRestartAndClaimChanges(t *testing.T) {
	e := newEnv(t)
	s, _ := e.open(t)
	other, _ := e.open(t)
	want := gpuRecords{
		Taints:     map[string]Taint{"gpu-1": lostTaint},
		MPSDaemons: map[string]MPSDaemon{"GPU-1": mpsDaemon, "uid-1-gpu-0": shareDaemon},
	}
	mustUpdate(t, s, func(d *Data) error {
		d.Taints, d.MPSDaemons = want.Taints, want.MPSDaemons
		return nil
	})
	claim := Claim{UID: "uid-1", Namespace: "ns", Name: "c", State: PrepareCompleted}
	for range 2 {
		if err := s.PutClaims(t.Context(), true, claim); err != nil {
			t.Fatal(err)
		}
	}
	reopened, rec := e.open(t)
	if rec.Corruption != nil {
		t.Fatalf("checkpoint with GPU records reported corrupt: %v", rec.Corruption)
	}
	if diff := cmp.Diff(want, gpuRecordsOf(reopened)); diff != "" {
		t.Errorf("GPU records after reopen (-want +got):\n%s", diff)
	}
	if err := other.Reload(t.Context()); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, gpuRecordsOf(other)); diff != "" {
		t.Errorf("GPU records after reload (-want +got):\n%s", diff)
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
