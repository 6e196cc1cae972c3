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

package atomicfile_test

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/prismgpu/prism/internal/atomicfile"
	"github.com/prismgpu/prism/internal/atomicfile/atomicfiletest"
)

func TestWriteFileReplacesWithExactMode(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "cert.pem")
	for _, tc := range []struct {
		data string
		perm os.FileMode
	}{{"first", 0o600}, {"second, longer", 0o644}, {"3", 0o640}} {
		if err := atomicfile.WriteFile(path, []byte(tc.data), tc.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != tc.data {
			t.Errorf("content = %q, want %q", got, tc.data)
		}
		st, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != tc.perm {
			t.Errorf("mode = %v, want %v whatever the umask", st.Mode().Perm(), tc.perm)
		}
	}
	if left, err := atomicfile.Leftovers(path); err != nil || len(left) != 0 {
		t.Errorf("Leftovers = %v, %v; want none", left, err)
	}
}

func TestWriteStreams(t *testing.T) {
	path := filepath.Join(t.TempDir(), "report.csv")
	if err := atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, err := fmt.Fprint(w, "a,b\n1,2\n")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(path); string(got) != "a,b\n1,2\n" {
		t.Errorf("content = %q", got)
	}

	// A reader that fails leaves the file as it was, and nothing beside it.
	errRead := errors.New("read limit exceeded")
	err := atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, _ = fmt.Fprint(w, "partial")
		return errRead
	})
	if !errors.Is(err, errRead) {
		t.Fatalf("Write = %v, want the fill's error", err)
	}
	if got, _ := os.ReadFile(path); string(got) != "a,b\n1,2\n" {
		t.Errorf("content after a failed write = %q", got)
	}
	if left, _ := atomicfile.Leftovers(path); len(left) != 0 {
		t.Errorf("temporary files left behind: %v", left)
	}
}

// A failure at any step before the rename leaves the old file and no
// temporary one; a failure at the directory sync comes after the rename.
func TestFailedStepLeavesOldFile(t *testing.T) {
	for _, tc := range []struct {
		failAt   string
		replaced bool
	}{
		{failAt: "create"},
		{failAt: "write"},
		{failAt: "chmod"},
		{failAt: "sync"},
		{failAt: "close"},
		{failAt: "rename"},
		{failAt: "syncdir", replaced: true},
	} {
		t.Run(tc.failAt, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "checkpoint")
			if err := atomicfile.WriteFile(path, []byte("old"), 0o600); err != nil {
				t.Fatal(err)
			}
			fsys := &atomicfiletest.FS{}
			fsys.FailAt(tc.failAt)
			err := atomicfile.WriteFileFS(fsys, path, []byte("new"), 0o600)
			if !errors.Is(err, atomicfiletest.ErrInjected) {
				t.Fatalf("WriteFileFS = %v, want the injected failure", err)
			}
			want := "old"
			if tc.replaced {
				want = "new"
			}
			if got, _ := os.ReadFile(path); string(got) != want {
				t.Errorf("content = %q, want %q", got, want)
			}
			if left, _ := atomicfile.Leftovers(path); len(left) != 0 {
				t.Errorf("temporary files left behind: %v", left)
			}
		})
	}
}

func TestLeftovers(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.json")
	for _, name := range []string{"usage.json", "usage.json.tmp-123", "usage.json.tmp-9", "other.json.tmp-1", "usage.json.corrupt-1"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got, err := atomicfile.Leftovers(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "usage.json.tmp-123"), filepath.Join(dir, "usage.json.tmp-9")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Leftovers (-want +got):\n%s", diff)
	}
}
