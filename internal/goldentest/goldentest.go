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

// Package goldentest holds a test's output to a golden file: a file under
// testdata that the output must equal byte for byte, so that a change to
// it shows in review as a change to the file.
//
// UPDATE_GOLDEN=1 rewrites the files instead of comparing them, in every
// package at once:
//
//	UPDATE_GOLDEN=1 go test ./pkg/...
//
// An environment variable rather than a -update flag, because go test
// fails a package whose test binary defines no such flag, and most do not.
// Rewrite only after the diff the failure shows is the change you meant,
// then review the files' diff before committing them.
package goldentest

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// UpdateEnv is the environment variable that, set to anything but "",
// rewrites golden files.
const UpdateEnv = "UPDATE_GOLDEN"

// Compare fails t, with a diff, when got differs from the file at path;
// with UPDATE_GOLDEN set it writes got to path first.
func Compare(t testing.TB, path string, got []byte) {
	t.Helper()
	if os.Getenv(UpdateEnv) != "" {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatalf("updating golden file: %v", err)
		}
		t.Logf("rewrote %s", path)
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (%s=1 go test creates it): %v", UpdateEnv, err)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("output differs from %s (-want +got); if the change is meant, %s=1 go test rewrites the file:\n%s", path, UpdateEnv, diff)
	}
}

// JSON is v as indented JSON with a final newline, the form JSON golden
// files hold.
func JSON(t testing.TB, v any) []byte {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("marshaling: %v", err)
	}
	return append(data, '\n')
}
