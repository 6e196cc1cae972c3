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
	"io"
	"os"
	"path/filepath"
	"slices"

	"github.com/prismgpu/prism/internal/atomicfile"

	"github.com/prismgpu/prism/internal/plugin/mountpoint"
)

const archiveDir = "archive"

var archiveNameRE = lazyRegexp(`^[0-9]{8}T[0-9]{6}\.[0-9]{9}Z-[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)

// archivedFiles are what Archive keeps of a claim directory: the plugin's
// inputs and ncu's outputs, nothing else the tenant wrote.
var archivedFiles = []string{ArgsFile, VersionFile, ReportFile, LogFile, ErrorFile}

// Archive moves a directory that Detach set aside, after Collect has read
// it, to <stateDir>/profiles/archive and removes all but the newest keep
// archived directories, so that reports survive for inspection but not
// forever. Only the report's files are kept, within the budget Collect
// reads with, with the job that names the claim and profile they were
// for, and the claim's tmpfs is unmounted, whatever else fails. The caller
// logs the error and goes on: a report that cannot be archived must not
// keep its directory pending.
func Archive(ctx context.Context, stateDir, dir string, keep int) error {
	name := filepath.Base(dir)
	if filepath.Dir(dir) != filepath.Join(stateDir, profilesDir, collectDir) || !archiveNameRE().MatchString(name) {
		return fmt.Errorf("archiving %s: not a directory set aside by Detach", dir)
	}
	out := filepath.Join(dir, outDir)
	kept := keepReport(ctx, out, dir)
	if err := errors.Join(mountpoint.Unmount(out), os.RemoveAll(out)); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, errors.Join(kept, err))
	}
	root := filepath.Join(stateDir, profilesDir, archiveDir)
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("creating profile archive: %w", errors.Join(kept, err))
	}
	dst := filepath.Join(root, name)
	if err := os.Rename(dir, dst); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, errors.Join(kept, err))
	}
	// No container writes here any more.
	if err := os.Chmod(dst, 0o755); err != nil {
		return fmt.Errorf("archiving %s: %w", dir, errors.Join(kept, err))
	}
	return errors.Join(kept, prune(root, keep))
}

// keepReport copies the archived files from the tenant's src, read as
// Collect reads them and streamed, to dst on disk.
func keepReport(ctx context.Context, src, dst string) error {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	files, err := openClaimFiles(src)
	var missing *CollectError
	if errors.As(err, &missing) {
		return nil
	}
	if err != nil {
		return err
	}
	defer files.close()
	var errs []error
	for _, name := range archivedFiles {
		r, err := files.reader(ctx, name)
		if err != nil {
			errs = append(errs, fmt.Errorf("not archiving %s: %w", name, err))
			continue
		}
		if r == nil {
			continue
		}
		err = atomicfile.Write(filepath.Join(dst, name), 0o644, func(w io.Writer) error {
			_, err := io.Copy(w, r)
			return err
		})
		r.close()
		if err != nil {
			errs = append(errs, fmt.Errorf("archiving %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func prune(root string, keep int) error {
	entries, err := os.ReadDir(root)
	if err != nil {
		return fmt.Errorf("listing profile archive: %w", err)
	}
	var names []string
	for _, e := range entries {
		// Only what Archive made is removed.
		if e.IsDir() && archiveNameRE().MatchString(e.Name()) {
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
