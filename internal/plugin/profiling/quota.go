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
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/prismgpu/prism/internal/plugin/mountpoint"
)

// The claim's containers write their report into a tmpfs of bounded size,
// so that a tenant cannot fill the state directory's file system. The tmpfs
// is mounted on <claimUID>/out rather than on <claimUID>: a mount point
// cannot be renamed (EBUSY), and Detach renames <claimUID>, which carries
// the mount along.
const (
	// outDir, in a claim directory, is what the containers mount.
	outDir = "out"
	// DefaultDirSize is the default bound on what a claim's containers may
	// write: a report of a thousand launches of the full set is a few MiB.
	DefaultDirSize = 256 << 20
	// quotaInodes bounds the number of files on a claim's tmpfs: inodes cost
	// kernel memory that size= does not count, and a report needs six.
	quotaInodes = 1024
	quotaFlags  = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	probeDir    = ".quota-probe"
)

// mount is replaced in tests to play a plugin that may not mount.
var mount = unix.Mount

// CheckQuota tells whether report directories can be bounded: it mounts a
// small tmpfs under <stateDir>/profiles and unmounts it again. It fails
// with EPERM where the plugin may not mount, as in an unprivileged
// container. On an error the caller must prepare claims with DirSize 0,
// which leaves their containers as much room as the state directory's file
// system has.
func CheckQuota(stateDir string) error {
	root, err := ensureProfilesRoot(stateDir)
	if err != nil {
		return err
	}
	dir := filepath.Join(root, probeDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	if err := errors.Join(mountQuota(dir, 1<<20), mountpoint.Unmount(dir), os.Remove(dir)); err != nil {
		return fmt.Errorf("bounding report directories with a tmpfs: %w", err)
	}
	return nil
}

// mountQuota mounts a world-writable tmpfs of size bytes on dir, unless one
// is mounted there already: a repeated prepare of the claim must keep the
// report its containers wrote so far.
func mountQuota(dir string, size int64) error {
	mounted, err := mountpoint.Is(dir)
	if err != nil || mounted {
		return err
	}
	// mode: the plugin cannot know the container's user (see Prepare).
	data := "size=" + strconv.FormatInt(size, 10) + ",nr_inodes=" + strconv.Itoa(quotaInodes) + ",mode=0777"
	if err := mount("prism-profile", dir, "tmpfs", quotaFlags, data); err != nil {
		return fmt.Errorf("mounting a %d-byte tmpfs on %s: %w", size, dir, err)
	}
	return nil
}

// removeClaimDir removes a claim directory, or one Detach set aside, after
// unmounting its tmpfs: RemoveAll would empty the tmpfs, then fail on the
// mount point, and leave its memory in use.
func removeClaimDir(dir string) error {
	if err := mountpoint.Unmount(filepath.Join(dir, outDir)); err != nil {
		return err
	}
	// RemoveAll removes symbolic links, it does not follow them.
	return os.RemoveAll(dir)
}
