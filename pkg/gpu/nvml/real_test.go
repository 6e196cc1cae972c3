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

package nvml

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
)

func TestNewTellsTheUserWhatToDo(t *testing.T) {
	for name, tc := range map[string]struct {
		setup    func(t *testing.T, root string)
		wantErrs []string
	}{
		"no driver under the root": {
			setup: func(*testing.T, string) {},
			wantErrs: []string{
				"libnvidia-ml.so.1 not found under driver root",
				filepath.Join("usr", "lib64", "libnvidia-ml.so.1"),
				"install the NVIDIA driver", "point the driver root",
			},
		},
		"the driver under a root of its own": {
			setup: func(t *testing.T, root string) {
				dir := filepath.Join(root, "usr", "local", "nvidia", "lib64")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so.1"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErrs: []string{
				"libnvidia-ml.so.1 not found under driver root",
				"but there is one under its usr/local/nvidia",
				"--driver-root=/usr/local/nvidia", "kubeletPlugin.driverRoot: /usr/local/nvidia",
			},
		},
		"a library that does not load": {
			setup: func(t *testing.T, root string) {
				dir := filepath.Join(root, "usr", "lib", "x86_64-linux-gnu")
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(dir, "libnvidia-ml.so.1"), []byte("not an ELF file"), 0o644); err != nil {
					t.Fatal(err)
				}
			},
			wantErrs: []string{
				filepath.Join("usr", "lib", "x86_64-linux-gnu", "libnvidia-ml.so.1"),
				"nvidia-smi should work",
			},
		},
	} {
		t.Run(name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			root := t.TempDir()
			tc.setup(t, root)
			lib, err := New(ctx, root)
			if err == nil {
				t.Fatalf("New(%q) = %v, want an error", root, lib)
			}
			if !errors.Is(err, ErrNoNVML) {
				t.Errorf("error %q does not wrap ErrNoNVML", err)
			}
			for _, want := range tc.wantErrs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestFindLibraryPrefersLib64(t *testing.T) {
	root := t.TempDir()
	for _, dir := range []string{"usr/lib64", "usr/lib/x86_64-linux-gnu"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, dir, libraryName), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, _ := findLibrary(root); got != filepath.Join(root, "usr/lib64", libraryName) {
		t.Errorf("findLibrary = %q, want the usr/lib64 copy", got)
	}
}
