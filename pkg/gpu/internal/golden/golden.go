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

// Package golden compares a test's result, as indented JSON, with a file
// under testdata. It is for the tests of pkg/gpu and its subpackages only.
package golden

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

// JSON is v as indented JSON, the form the golden files hold.
func JSON(t testing.TB, v any) string {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("marshaling: %v", err)
	}
	return string(data)
}

// Compare fails t when got, as JSON, differs from the file at path;
// go test -update rewrites the file instead.
func Compare(t testing.TB, path string, got any) {
	t.Helper()
	data := []byte(JSON(t, got) + "\n")
	if *update {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatalf("updating golden file: %v", err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (go test -update creates it): %v", err)
	}
	if !bytes.Equal(data, want) {
		t.Errorf("result differs from %s (go test -update rewrites it); got:\n%s", path, data)
	}
}
