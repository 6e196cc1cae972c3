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
	"testing"
	"time"
)

func TestArchive(t *testing.T) {
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
		if err := Archive(state, uid, 2); err != nil {
			t.Fatalf("Archive(%s): %v", uid, err)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Errorf("claim directory %s still there: %v", dir, err)
		}
	}
	if err := Archive(state, "never-prepared", 2); err != nil {
		t.Errorf("Archive of a claim without a directory: %v", err)
	}
	if err := Archive(state, "../escape", 2); err == nil {
		t.Errorf("Archive accepted a claim UID with a path")
	}

	entries, err := os.ReadDir(archive)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	want := []string{"20260301T120003.000000000Z-uid-c", "20260301T120004.000000000Z-uid-d", "keep-me"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("archive holds %q, want %q", got, want)
	}
	data, err := os.ReadFile(filepath.Join(archive, want[1], ReportFile))
	if err != nil || string(data) != "uid-d" {
		t.Errorf("archived report: %q, %v", data, err)
	}
}
