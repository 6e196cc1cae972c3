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
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"k8s.io/klog/v2"
)

// A claim's report directory moves through three places under
// <stateDir>/profiles, all made by the plugin:
//
//	<claimUID>/out/                  mounted into the claim's containers
//	collect/<timestamp>-<uid>/out/   set aside at unprepare, read by Collect
//	collect/<timestamp>-<uid>/job.json  what to publish it as (Job)
//	archive/<timestamp>-<uid>/       its files, kept for people, pruned to a count
//
// out is a tmpfs while the claim's containers may write to it (see
// mountQuota); the archive is on disk.
const (
	collectDir = "collect"
	// archiveTimeFormat sorts lexically in time order and keeps claims
	// set aside in the same second apart.
	archiveTimeFormat = "20060102T150405.000000000Z"
	// profilesMode keeps other host users out of the report directories,
	// which are world-writable for the container's sake (see Prepare). The
	// runtime that bind-mounts them runs as root and needs no permission.
	profilesMode = 0o700
)

// now is replaced in tests.
var now = time.Now

// ensureProfilesRoot creates <stateDir>/profiles, and tightens the mode of
// one made by an older plugin.
func ensureProfilesRoot(stateDir string) (string, error) {
	root := filepath.Join(stateDir, profilesDir)
	if err := os.MkdirAll(root, profilesMode); err != nil {
		return "", fmt.Errorf("creating %s: %w", root, err)
	}
	if err := os.Chmod(root, profilesMode); err != nil {
		return "", fmt.Errorf("restricting %s: %w", root, err)
	}
	return root, nil
}

// Detach moves the report directory of job's claim aside, with the tmpfs
// mounted in it, to <stateDir>/profiles/collect/<timestamp>-<claimUID>,
// with job written beside the report, and returns the new path, or "" when
// the claim has none. It is a small write and one rename, cheap enough to
// do under the plugin's lock; the moved directory can then be read by
// Collect without the lock, while a new preparation of the same claim
// starts from an empty directory.
func Detach(stateDir string, job Job) (string, error) {
	claimUID := string(job.Claim.UID)
	if err := validateClaimUID(claimUID); err != nil {
		return "", err
	}
	src := claimRoot(stateDir, claimUID)
	if _, err := os.Lstat(src); errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	// Before the rename, so that every directory in collect/ that has
	// its report has its job too.
	if err := writeJob(src, job); err != nil {
		return "", fmt.Errorf("recording the report job of claim %s: %w", claimUID, err)
	}
	root := filepath.Join(stateDir, profilesDir, collectDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return "", fmt.Errorf("creating %s: %w", root, err)
	}
	dst := filepath.Join(root, now().UTC().Format(archiveTimeFormat)+"-"+claimUID)
	if err := os.Rename(src, dst); err != nil {
		return "", fmt.Errorf("setting aside the report directory of claim %s: %w", claimUID, err)
	}
	return dst, nil
}

// DiscardClaimDir removes a claim's report directory without reading it.
// It is for claims released without an unprepare (stale claims): nobody is
// left to publish their report to. A claim without a directory is not an
// error.
func DiscardClaimDir(stateDir, claimUID string) error {
	if err := validateClaimUID(claimUID); err != nil {
		return err
	}
	if err := removeClaimDir(claimRoot(stateDir, claimUID)); err != nil {
		return fmt.Errorf("removing the report directory of claim %s: %w", claimUID, err)
	}
	return nil
}

// SweepClaimDirs removes, at start-up, the report directories of claims
// for which prepared is false, and the directories in collect/ without a
// job (set aside by an older plugin): neither will ever be collected.
// Directories in collect/ with a job are PendingJobs. The archive is left
// alone.
func SweepClaimDirs(ctx context.Context, stateDir string, prepared func(claimUID string) bool) error {
	logger := klog.FromContext(ctx)
	root := filepath.Join(stateDir, profilesDir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", root, err)
	}
	var stale []string
	for _, e := range entries {
		if e.IsDir() && validateClaimUID(e.Name()) == nil && e.Name() != archiveDir && e.Name() != collectDir && !prepared(e.Name()) {
			stale = append(stale, filepath.Join(root, e.Name()))
		}
	}
	interrupted, err := os.ReadDir(filepath.Join(root, collectDir))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("listing %s: %w", filepath.Join(root, collectDir), err)
	}
	for _, e := range interrupted {
		dir := filepath.Join(root, collectDir, e.Name())
		if !archiveNameRE().MatchString(e.Name()) {
			continue
		}
		if _, err := readJob(dir); err != nil {
			stale = append(stale, dir)
		}
	}
	var errs []error
	for _, dir := range stale {
		if err := removeClaimDir(dir); err != nil {
			errs = append(errs, err)
			continue
		}
		logger.Info("Removed a report directory no prepared claim owns", "dir", dir)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sweeping report directories: %w", err)
	}
	return nil
}
