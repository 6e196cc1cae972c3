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

package mountpoint

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestIsAndUnmount(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "d")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if mounted, err := Is(dir); err != nil || mounted {
		t.Fatalf("Is(plain directory) = %v, %v; want false", mounted, err)
	}
	if err := Unmount(dir); err != nil {
		t.Errorf("Unmount(plain directory): %v", err)
	}
	if err := Unmount(filepath.Join(dir, "gone")); err != nil {
		t.Errorf("Unmount(missing directory): %v", err)
	}
	if _, err := Is(filepath.Join(dir, "gone")); err == nil {
		t.Error("Is(missing directory) gave no error")
	}
	if os.Geteuid() != 0 {
		t.Log("not root: the mounted case needs a tmpfs mount")
		return
	}
	if err := unix.Mount("mountpoint-test", dir, "tmpfs", 0, "size=4096"); err != nil {
		t.Fatalf("mounting a tmpfs as root: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if mounted, err := Is(dir); err != nil || !mounted {
		t.Fatalf("Is(tmpfs) = %v, %v; want true", mounted, err)
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	if mounted, err := Is(dir); err != nil || mounted {
		t.Errorf("after Unmount, Is = %v, %v; want false", mounted, err)
	}
}
