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

// Package atomicfile replaces a file so that whoever reads it, a process
// beside the writer or the writer itself after a crash or a power cut,
// finds the old content or the new, never a part of either and never an
// empty file.
//
// A write goes to a temporary file in the target's directory, so that the
// rename stays on one file system. The temporary file is created with
// O_EXCL and mode 0600: it never follows a link someone planted under its
// name, two writers of one path never share one, and a key file is never
// readable by others, even for the moment before its mode is set. The
// mode is then set to the caller's, exactly (the umask does not apply),
// the file is fsynced, renamed over the target and the directory fsynced.
// Without the first fsync a power cut after the rename can leave the
// target empty; without the second, the rename itself may be lost. A
// write that fails before the rename removes the temporary file and
// leaves the target as it was. One that fails at the directory sync has
// already replaced the target; only its durability is unknown.
//
// Every step is there for one of the writers: the fsyncs for the
// checkpoint, whose prepared claims must outlive a power cut, and so for
// every writer, since each writes seldom (usage records at most every
// 30 s) and a record lost to an empty file costs more than a flush; the
// 0600 start for the serving certificate's key; the exact mode for the
// profiling files a container's user reads; and the unique name for the
// simulator's usage file, which a test rewrites while the plugin reads it.
//
// A crash between the create and the rename leaves the temporary file
// behind; Leftovers finds those of one target, for a caller that removes
// them at start-up.
package atomicfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// tempInfix follows the target's name in the temporary file's; CreateTemp
// appends random digits.
const tempInfix = ".tmp-"

// WriteFile replaces the file at path with data, with permissions perm.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	return WriteFileFS(OS{}, path, data, perm)
}

// WriteFileFS is WriteFile on fsys; a caller's tests make a step fail
// through it.
func WriteFileFS(fsys FS, path string, data []byte, perm os.FileMode) error {
	return write(fsys, path, perm, func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// Write replaces the file at path with what fill writes, with permissions
// perm, for content that is streamed rather than held. An error from fill
// is returned as it is, and the target is left as it was.
func Write(path string, perm os.FileMode, fill func(io.Writer) error) error {
	return write(OS{}, path, perm, fill)
}

func write(fsys FS, path string, perm os.FileMode, fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := fsys.CreateTemp(dir, filepath.Base(path)+tempInfix+"*")
	if err != nil {
		return fmt.Errorf("creating temporary file: %w", err)
	}
	tmp, closed, renamed := f.Name(), false, false
	defer func() {
		if !closed {
			_ = f.Close()
		}
		if !renamed {
			_ = fsys.Remove(tmp)
		}
	}()
	if err := fill(f); err != nil {
		return err
	}
	if err := f.Chmod(perm); err != nil {
		return fmt.Errorf("setting the mode of the temporary file: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("syncing temporary file: %w", err)
	}
	closed = true
	if err := f.Close(); err != nil {
		return fmt.Errorf("closing temporary file: %w", err)
	}
	if err := fsys.Rename(tmp, path); err != nil {
		return fmt.Errorf("renaming temporary file: %w", err)
	}
	renamed = true
	if err := fsys.SyncDir(dir); err != nil {
		return fmt.Errorf("syncing directory: %w", err)
	}
	return nil
}

// Leftovers returns the temporary files that writes to path cut short by
// a crash left beside it.
func Leftovers(path string) ([]string, error) {
	dir, prefix := filepath.Dir(path), filepath.Base(path)+tempInfix
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && e.Type().IsRegular() {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}
