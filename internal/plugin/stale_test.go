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

package plugin

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// TestStaleCollectorKeepsTheOtherInstancesClaims: during a rolling update
// the old instance releases a stale claim while the new one has prepared
// another; the old instance's write must not drop it.
func TestStaleCollectorKeepsTheOtherInstancesClaims(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	old, updated := rollingUpdateInstances(t, dir)

	// Claim a is in neither instance's API: stale.
	if r := prepare(t, old, allocatedClaim("a", []string{"gpu-0"}))["a"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if r := prepare(t, updated, allocatedClaim("c", []string{"gpu-1"}))["c"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	old.collectStale(ctx, 0)

	if diff := cmp.Diff([]string{"c"}, checkpointedClaims(t, dir)); diff != "" {
		t.Errorf("claims recorded after the old instance released stale claim a (-want +got):\n%s", diff)
	}
}

// TestStaleReleaseUndoesEverything: a claim released because it vanished
// from the API gets its time slice reset and its report directory removed,
// as an unprepare would.
func TestStaleReleaseUndoesEverything(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	d := profilingDriver(t, dir)
	slices := &RecordedTimeSlices{}
	d.state.timeSlices.slicer = slices
	timeSliced := allocatedClaim("ts", []string{"gpu-1"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"TimeSlicing","timeSlicing":{"interval":"Long"}}}`))
	profiled := allocatedClaim("prof", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`))
	if r := prepare(t, d, timeSliced, profiled); r["ts"].Err != nil || r["prof"].Err != nil {
		t.Fatal(r["ts"].Err, r["prof"].Err)
	}
	reportDir := profiling.ClaimDir(dir, "prof")
	if _, err := os.Stat(reportDir); err != nil {
		t.Fatalf("profiled claim has no report directory: %v", err)
	}

	d.collectStale(ctx, 0)
	if left := d.state.checkpoint.List(); len(left) != 0 {
		t.Fatalf("%d claims left after both vanished from the API", len(left))
	}
	g, _ := d.state.gpus.get("gpu-1")
	if got := slices.Get(g.UUID); got != "Default" {
		t.Errorf("time slice of gpu-1 after the stale release = %q, want Default", got)
	}
	if _, err := os.Lstat(reportDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("report directory of the stale claim left behind: %v", err)
	}
}

// TestStaleReleaseDestroysMIGInstances: a claim on a MIG partition that is
// released because it vanished from the API has its instance destroyed, as
// an unprepare would. Left behind, the instance is nobody's, and the
// partition and every one overlapping it fail to prepare, restart or not.
func TestStaleReleaseDestroysMIGInstances(t *testing.T) {
	for name, next := range map[string]string{
		"same partition": partition1g,
		// A 2g.10gb at slices 2-3 covers the partition's slice 3.
		"overlapping partition": "gpu-0-mig-2g10gb-2",
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			n := newMIGNode(t)
			d := n.driver(t)
			if r := prepare(t, d, allocatedClaim("m", []string{partition1g}))["m"]; r.Err != nil {
				t.Fatal(r.Err)
			}

			d.collectStale(ctx, 0)
			if _, ok := d.state.checkpoint.Get("m"); ok {
				t.Fatal("the stale claim was not released")
			}
			if got := n.instances(t); len(got) != 0 {
				t.Errorf("instances left after the stale release: %v", got)
			}
			restarted := n.driver(t)
			if r := prepare(t, restarted, allocatedClaim("next", []string{next}))["next"]; r.Err != nil {
				t.Errorf("prepare of %s after the stale release: %v", next, r.Err)
			}
		})
	}
}

// fastAPIBackoff retries start-up's API calls without waiting.
func fastAPIBackoff(t *testing.T, steps int) {
	saved := defaultAPIBackoff
	defaultAPIBackoff = wait.Backoff{Duration: 1, Steps: steps}
	t.Cleanup(func() { defaultAPIBackoff = saved })
}

// TestLostCheckpointWithTheAPIDownKeepsSpecs: after the checkpoint is lost,
// the CDI specs of running pods are kept while their claims cannot be read,
// and adopted once they can.
func TestLostCheckpointWithTheAPIDownKeepsSpecs(t *testing.T) {
	for _, tc := range []struct {
		name        string
		failedLists int // before the API answers; -1 never
		wantAdopted bool
	}{
		{"API down throughout", -1, false},
		{"API back while waiting", 2, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			fastAPIBackoff(t, 4)
			dir := t.TempDir()
			client := fake.NewClientset()
			claim := allocatedClaim("running", []string{"gpu-0"})
			if _, err := client.ResourceV1().ResourceClaims("ns").Create(ctx, claim, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			d := newTestDriverWith(t, "t4-2.yaml", dir, func(c *Config) { c.KubeClient = client })
			if r := prepare(t, d, claim)["running"]; r.Err != nil {
				t.Fatal(r.Err)
			}
			if err := os.WriteFile(filepath.Join(dir, checkpoint.DefaultFileName), []byte("{garbage"), 0o600); err != nil {
				t.Fatal(err)
			}

			failures := 0
			client.PrependReactor("list", "resourceclaims", func(k8stesting.Action) (bool, runtime.Object, error) {
				if tc.failedLists < 0 || failures < tc.failedLists {
					failures++
					return true, nil, errors.New("connection refused")
				}
				return false, nil, nil
			})
			restarted := newTestDriverWith(t, "t4-2.yaml", dir, func(c *Config) { c.KubeClient = client })
			specs, err := restarted.cfg.CDI.ListClaimSpecs(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(specs) != 1 || specs[0] != "running" {
				t.Errorf("CDI specs after the restart %v, want the running claim's", specs)
			}
			if _, adopted := restarted.state.checkpoint.Get("running"); adopted != tc.wantAdopted {
				t.Errorf("claim adopted = %v, want %v", adopted, tc.wantAdopted)
			}
			if !tc.wantAdopted {
				waitForEvent(t, client, "CheckpointNotRebuilt")
			}
		})
	}
}

// TestStartRemovesReportDirectoriesOfUnpreparedClaims: a report directory
// whose claim the checkpoint no longer holds (released while the plugin
// was down) is removed at start; a prepared claim's stays.
func TestStartRemovesReportDirectoriesOfUnpreparedClaims(t *testing.T) {
	dir := t.TempDir()
	d := profilingDriver(t, dir)
	if r := prepare(t, d, allocatedClaim("kept", []string{"gpu-0"}, opaque(profilingConfig)))["kept"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	stray := profiling.ClaimDir(dir, "gone")
	if err := os.MkdirAll(stray, 0o755); err != nil {
		t.Fatal(err)
	}

	profilingDriver(t, dir)
	if _, err := os.Lstat(stray); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("report directory of an unprepared claim survived the start: %v", err)
	}
	if _, err := os.Stat(profiling.ClaimDir(dir, "kept")); err != nil {
		t.Errorf("report directory of a prepared claim removed: %v", err)
	}
}
