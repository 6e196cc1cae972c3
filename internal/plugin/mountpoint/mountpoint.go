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

// Package mountpoint finds and removes the tmpfs mounts the kubelet plugin
// puts on directories of its state directory (report directories, MPS
// pipe directories), whose parents are always on the state directory's
// file system.
package mountpoint

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Is tells whether something is mounted on dir, by comparing its device
// with its parent's.
func Is(dir string) (bool, error) {
	var st, parent unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return false, &fs.PathError{Op: "lstat", Path: dir, Err: err}
	}
	if err := unix.Lstat(filepath.Dir(dir), &parent); err != nil {
		return false, &fs.PathError{Op: "lstat", Path: filepath.Dir(dir), Err: err}
	}
	return st.Dev != parent.Dev, nil
}

// Unmount unmounts what is mounted on dir, if anything: nothing for a
// directory that is gone or has no mount. Lazily: a container still being
// torn down may hold it, and a tmpfs's memory is freed once the last user
// is gone.
func Unmount(dir string) error {
	// Looking first: a plugin that may not mount may not unmount either,
	// not even a directory without a mount.
	mounted, err := Is(dir)
	if errors.Is(err, fs.ErrNotExist) || (err == nil && !mounted) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmounting %s: %w", dir, err)
	}
	return nil
}
