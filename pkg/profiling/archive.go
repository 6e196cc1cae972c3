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
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"time"
)

const (
	archiveDir = "archive"
	// archiveTimeFormat sorts lexically in time order and keeps claims
	// archived in the same second apart.
	archiveTimeFormat = "20060102T150405.000000000Z"
)

var archiveNameRE = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}\.[0-9]{9}Z-[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)

// now is replaced in tests.
var now = time.Now

// Archive moves a claim's profile directory to
// <stateDir>/profiles/archive/<timestamp>-<claimUID> and removes all but the
// newest keep archived directories, so that reports survive for inspection
// but not forever. A claim without a directory is not an error. The caller
// logs the error and goes on: unprepare must never fail because of
// retention.
func Archive(stateDir, claimUID string, keep int) error {
	if err := validateClaimUID(claimUID); err != nil {
		return err
	}
	src := ClaimDir(stateDir, claimUID)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	root := filepath.Join(stateDir, profilesDir, archiveDir)
	if err := os.MkdirAll(root, 0o755); err != nil {
		return fmt.Errorf("creating profile archive: %w", err)
	}
	dst := filepath.Join(root, now().UTC().Format(archiveTimeFormat)+"-"+claimUID)
	if err := os.Rename(src, dst); err != nil {
		return fmt.Errorf("archiving profile of claim %s: %w", claimUID, err)
	}
	// Archived reports are for people, not for containers.
	if err := os.Chmod(dst, 0o755); err != nil {
		return fmt.Errorf("archiving profile of claim %s: %w", claimUID, err)
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
