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
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"
)

func TestDetachAndArchive(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	state := t.TempDir()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tick := 0
	now = func() time.Time { tick++; return start.Add(time.Duration(tick) * time.Second) }
	t.Cleanup(func() { now = time.Now })

	archive := filepath.Join(state, "profiles", "archive")
	// Something Archive did not make is never pruned.
	if err := os.MkdirAll(filepath.Join(archive, "keep-me"), 0o755); err != nil {
		t.Fatal(err)
	}
	uids := []string{"uid-a", "uid-b", "uid-c", "uid-d"}
	for _, uid := range uids {
		dir := ClaimDir(state, uid)
		if err := os.MkdirAll(dir, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, ReportFile), []byte(uid), 0o644); err != nil {
			t.Fatal(err)
		}
		detached, err := Detach(state, jobFor(uid))
		if err != nil {
			t.Fatalf("Detach(%s): %v", uid, err)
		}
		// A new preparation of the claim must not find the old report.
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("claim directory %s still there: %v", dir, err)
		}
		if data, err := os.ReadFile(filepath.Join(detached, outDir, ReportFile)); err != nil || string(data) != uid {
			t.Errorf("detached report: %q, %v", data, err)
		}
		if err := Archive(ctx, state, detached, 2); err != nil {
			t.Fatalf("Archive(%s): %v", detached, err)
		}
	}
	if detached, err := Detach(state, jobFor("never-prepared")); err != nil || detached != "" {
		t.Errorf("Detach of a claim without a directory: %q, %v", detached, err)
	}
	if _, err := Detach(state, jobFor("../escape")); err == nil {
		t.Errorf("Detach accepted a claim UID with a path")
	}
	if err := Archive(ctx, state, filepath.Join(state, "profiles", "uid-x"), 2); err == nil {
		t.Errorf("Archive accepted a directory Detach did not set aside")
	}

	got := dirNames(t, archive)
	want := []string{"20260301T120003.000000000Z-uid-c", "20260301T120004.000000000Z-uid-d", "keep-me"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("archive holds %q, want %q", got, want)
	}
	data, err := os.ReadFile(filepath.Join(archive, want[1], ReportFile))
	if err != nil || string(data) != "uid-d" {
		t.Errorf("archived report: %q, %v", data, err)
	}
}

// dirNames lists the names in dir, sorted as os.ReadDir sorts them.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// TestDiscardClaimDir: a stale claim's report directory goes with it,
// and a symbolic link in it is removed, not followed.
func TestDiscardClaimDir(t *testing.T) {
	state := t.TempDir()
	outside := filepath.Join(t.TempDir(), "precious")
	if err := os.WriteFile(outside, []byte("keep"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := ClaimDir(state, testClaimUID)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, filepath.Join(dir, ReportFile)); err != nil {
		t.Fatal(err)
	}
	if err := DiscardClaimDir(state, testClaimUID); err != nil {
		t.Fatalf("DiscardClaimDir: %v", err)
	}
	if _, err := os.Lstat(dir); !os.IsNotExist(err) {
		t.Errorf("claim directory still there: %v", err)
	}
	if data, err := os.ReadFile(outside); err != nil || string(data) != "keep" {
		t.Errorf("file behind the link: %q, %v", data, err)
	}
	if err := DiscardClaimDir(state, testClaimUID); err != nil {
		t.Errorf("DiscardClaimDir of a claim without a directory: %v", err)
	}
	if err := DiscardClaimDir(state, "../.."); err == nil {
		t.Errorf("DiscardClaimDir accepted a claim UID with a path")
	}
}

func TestSweepClaimDirs(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	state := t.TempDir()
	profiles := filepath.Join(state, "profiles")
	for _, d := range []string{
		"prepared-uid", "gone-uid", "archive/20260301T120000.000000000Z-old-uid",
		"collect/20260301T120000.000000000Z-interrupted-uid",
	} {
		if err := os.MkdirAll(filepath.Join(profiles, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(profiles, preloadFile), []byte(ContainerShimPath), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := SweepClaimDirs(ctx, state, func(uid string) bool { return uid == "prepared-uid" }); err != nil {
		t.Fatalf("SweepClaimDirs: %v", err)
	}
	var got []string
	err := filepath.WalkDir(profiles, func(path string, _ os.DirEntry, err error) error {
		rel, _ := filepath.Rel(profiles, path)
		got = append(got, rel)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	want := []string{".", "archive", "archive/20260301T120000.000000000Z-old-uid", "collect", preloadFile, "prepared-uid"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("after the sweep: %q, want %q", got, want)
	}
	if err := SweepClaimDirs(ctx, t.TempDir(), func(string) bool { return false }); err != nil {
		t.Errorf("SweepClaimDirs without a profiles directory: %v", err)
	}
}
