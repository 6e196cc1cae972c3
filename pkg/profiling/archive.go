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
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
)

const archiveDir = "archive"

var archiveNameRE = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}\.[0-9]{9}Z-[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)

// Archive moves a directory that Detach set aside, after Collect has read
// it, to <stateDir>/profiles/archive and removes all but the newest keep
// archived directories, so that reports survive for inspection but not
// forever. The caller logs the error and goes on: unprepare must never fail
// because of retention.
func Archive(stateDir, dir string, keep int) error {
	name := filepath.Base(dir)
	if filepath.Dir(dir) != filepath.Join(stateDir, profilesDir, collectDir) || !archiveNameRE.MatchString(name) {
		return fmt.Errorf("archiving %s: not a directory set aside by Detach", dir)
	}
	root := filepath.Join(stateDir, profilesDir, archiveDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("creating profile archive: %w", err)
	}
	dst := filepath.Join(root, name)
	if err := os.Rename(dir, dst); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	// No container writes here any more.
	if err := os.Chmod(dst, 0o755); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, err)
	}
	return prune(root, keep)
}

func prune(root string, keep int) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("listing profile archive: %w", err)
	}
	var names []string
	for _, e := range entries {
		// Only what Archive made is removed.
		if e.IsDir() && archiveNameRE.MatchString(e.Name()) {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	var errs []error
	for len(names) > max(keep, 0) {
		if err := os.RemoveAll(filepath.Join(root, names[0])); err != nil {
			errs = append(errs, err)
		}
		names = names[1:]
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("pruning profile archive: %w", err)
	}
	return nil
}
