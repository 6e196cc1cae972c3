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

package goldentest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that keeps what a failing Compare says.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}

func (r *recorder) Logf(string, ...any) {}

func (r *recorder) Errorf(format string, args ...any) { r.failed = fmt.Sprintf(format, args...) }

func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// compare runs Compare on its own goroutine, which Fatalf ends, and
// returns what it failed with.
func compare(t *testing.T, path string, got []byte) string {
	r := &recorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Compare(r, path, got)
	}()
	<-done
	return r.failed
}

func TestCompare(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.golden.txt")
	if err := os.WriteFile(path, []byte("a\nb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv(UpdateEnv, "")

	if failed := compare(t, path, []byte("a\nb\n")); failed != "" {
		t.Errorf("equal output failed: %s", failed)
	}
	failed := compare(t, path, []byte("a\nc\n"))
	for _, want := range []string{path, "(-want +got)", `"a\nc\n"`, UpdateEnv + "=1 go test rewrites"} {
		if !strings.Contains(failed, want) {
			t.Errorf("failure %q does not say %q", failed, want)
		}
	}
	if failed := compare(t, filepath.Join(t.TempDir(), "missing"), nil); !strings.Contains(failed, UpdateEnv+"=1 go test creates it") {
		t.Errorf("a missing file fails with %q, which does not say how to create it", failed)
	}
}

func TestCompareUpdates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.golden.txt")
	t.Setenv(UpdateEnv, "1")
	if failed := compare(t, path, []byte("new\n")); failed != "" {
		t.Errorf("update failed: %s", failed)
	}
	if got, _ := os.ReadFile(path); string(got) != "new\n" {
		t.Errorf("file holds %q after an update", got)
	}
}

func TestJSON(t *testing.T) {
	got := JSON(t, map[string]int{"b": 2, "a": 1})
	if want := "{\n  \"a\": 1,\n  \"b\": 2\n}\n"; string(got) != want {
		t.Errorf("JSON = %q, want %q", got, want)
	}
}
