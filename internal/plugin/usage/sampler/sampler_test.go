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

package sampler

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2/ktesting"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

// TestLoadTakesUpTheRunsLeft: a stopped plugin's records go on where their
// claim is still prepared, are published where it is gone or the record
// says it ended, and unreadable ones and cut-short writes are removed; a
// prepared claim without a record is sampled from now on.
func TestLoadTakesUpTheRunsLeft(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	run := usage.Run{}
	for range usage.MinSamples {
		run.Add(usage.Sample{DutyCyclePercent: 40, MemoryBytes: 1 << 30, SMActivityPercent: usage.Unknown, DRAMActivityPercent: usage.Unknown})
	}
	ended := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	claim := func(uid string) prismv1alpha1.ClaimReference {
		return prismv1alpha1.ClaimReference{Namespace: "ns", Name: "claim-" + uid, UID: types.UID(uid)}
	}
	for _, r := range []runRecord{
		{Claim: claim("going"), Profile: "train", Run: run, ProductName: "recorded GPU"},
		{Claim: claim("gone"), Profile: "train", Run: run},
		{Claim: claim("ended"), Profile: "train", Run: run, EndedAt: &ended},
	} {
		data, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, string(r.Claim.UID)+".json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for name, data := range map[string]string{"torn.json": "{", "going.json.tmp123": "{}"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).Build()
	registry := prometheus.NewRegistry()
	s := New(Config{Profiles: profilingtest.WorkloadProfiles(api)}, Env{
		Dir: dir, NodeName: "node-a", Recorder: record.NewFakeRecorder(10), Metrics: NewMetrics(registry),
		Dropped:  prometheus.NewCounter(prometheus.CounterOpts{Name: "dropped"}),
		Prepared: func(string) bool { return true },
	})
	s.Load(ctx, []Claim{
		{Ref: claim("going"), ProductName: "GPU read now"},
		{Ref: claim("ended")},
		{Ref: claim("fresh"), Profile: "train"},
	})

	if diff := cmp.Diff(map[string]int32{"going": usage.MinSamples, "fresh": 0}, s.Samples()); diff != "" {
		t.Errorf("runs sampled on (-want +got):\n%s", diff)
	}
	if got := s.claims["going"].rec.ProductName; got != "recorded GPU" {
		t.Errorf("product of a run that goes on: %q, want the recorded one", got)
	}
	for range 2 {
		s.PublishNext(ctx)
	}
	if diff := cmp.Diff(map[string]float64{"Merged": 2}, metricstest.Counters(t, registry, "prism_plugin_usage_runs_total", "outcome")); diff != "" {
		t.Errorf("published runs by outcome (-want +got):\n%s", diff)
	}
	wp := &prismv1alpha1.WorkloadProfile{}
	if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "train"}, wp); err != nil {
		t.Fatal(err)
	}
	if wp.Status.Usage == nil || wp.Status.Usage.Runs != 2 {
		t.Errorf("status.usage of ns/train: %+v, want 2 runs merged", wp.Status.Usage)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	slices.Sort(left)
	// The records of the runs that go on are written by the next persist.
	if diff := cmp.Diff([]string{"going.json"}, left); diff != "" {
		t.Errorf("files left (-want +got):\n%s", diff)
	}
}

// TestRecordOfAnEarlierReleaseReads: testdata/uid-share.json was written
// by the release before usage.Share became gpuv1alpha1.Share. A restarted
// plugin reads its share, and writes the record back in the same form, so
// that the release before reads it after a rollback.
func TestRecordOfAnEarlierReleaseReads(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	written, err := os.ReadFile(filepath.Join("testdata", "uid-share.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "uid-share.json"), written, 0o600); err != nil {
		t.Fatal(err)
	}
	// The record's time, so that the record written back is the same.
	clk := testingclock.NewFakeClock(time.Date(2026, 11, 29, 5, 0, 0, 0, time.UTC))
	s := New(Config{}, Env{Dir: dir, Clock: clk, Prepared: func(string) bool { return true }})
	ref := prismv1alpha1.ClaimReference{Namespace: "ml", Name: "train-0", UID: "uid-share"}
	s.Load(ctx, []Claim{{Ref: ref, Profile: "train"}})

	tracked, ok := s.claims["uid-share"]
	if !ok {
		t.Fatalf("the record's run is not taken up; sampling %v", s.Samples())
	}
	if diff := cmp.Diff(&gpuv1alpha1.Share{ComputePercent: 45, MemoryBytes: 8 << 30}, tracked.rec.Share); diff != "" {
		t.Errorf("share read from the record (-want +got):\n%s", diff)
	}
	s.Persist(ctx)
	again, err := os.ReadFile(filepath.Join(dir, "uid-share.json"))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(string(written), string(again)); diff != "" {
		t.Errorf("record written back (-earlier release +now):\n%s", diff)
	}
}
