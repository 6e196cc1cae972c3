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

package mps

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/prismgpu/prism/internal/plugin/mountpoint"
)

// A GPU's pipe directory is the one thing its tenants share: every share's
// containers mount it read-write, because clients of any UID must reach the
// daemon's pipes and MPS does not document that they create nothing there.
// Three rules keep one tenant from breaking it for the others:
//
//   - its mode is 01777: anyone may create files, but the sticky bit keeps
//     a file from being removed or renamed by anyone but its owner and
//     root, so the daemon's pipes and each tenant's files stay theirs. A
//     container that runs as root passes the sticky bit (CAP_FOWNER); the
//     next check catches what it breaks;
//   - before each share is prepared, Ensure checks that the daemon's control
//     pipe is still there, a pipe or socket, and the daemon's own; a daemon
//     whose pipe is not is killed and replaced;
//   - it is a tmpfs of PipeDirSize bytes and pipeDirInodes files, where the
//     plugin can mount one that the host sees, so that what tenants write
//     there lands neither on the host's disk nor beyond that bound.
const (
	pipeDirMode = 0o1777
	// PipeDirSize bounds what a GPU's tenants can write to its pipe
	// directory: the daemon's pipes and lock files take a few KiB.
	PipeDirSize = 16 << 20
	// pipeDirInodes bounds the files: inodes cost kernel memory that size=
	// does not count.
	pipeDirInodes = 4096
	pipeDirFlags  = unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC
	probeDir      = ".bound-probe"
	// ShmDirSize bounds a share's /dev/shm: its MPS server's and clients'
	// segments, and whatever else the workload keeps there, since the
	// directory replaces the pod's /dev/shm in the share's containers
	// (data loaders pass batches through it). Pages are charged to the
	// memory of the container that writes them, so the bound is generous.
	ShmDirSize = 8 << 30
	// shmDirInodes: data loaders keep a file per batch in flight.
	shmDirInodes = 65536
)

// Replaced in tests: mount plays a plugin that may not mount, propagates
// one whose mounts do or do not reach the host.
var (
	mount      = unix.Mount
	propagates = sharedMount
)

// checkBound tells whether pipe directories under root can be bounded by a
// tmpfs: a mount made there must reach the host, where the container runtime
// bind-mounts the directory into the shares' containers (a tmpfs that only
// the plugin sees would hide the daemon's pipes from them, and MPS clients
// that cannot reach the daemon run without it, silently), and the plugin
// must be allowed to mount (EPERM in an unprivileged container).
func checkBound(root string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	if err := propagates(root); err != nil {
		return err
	}
	dir := filepath.Join(root, probeDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	mountErr := mount("prism-mps", dir, "tmpfs", pipeDirFlags, "size=4096,nr_inodes=16,mode=0700")
	if mountErr != nil {
		mountErr = fmt.Errorf("mounting a tmpfs on %s: %w", dir, mountErr)
	}
	return errors.Join(mountErr, mountpoint.Unmount(dir), os.Remove(dir))
}

// sharedMount says why mounts made under dir do not reach the host, nil
// when they do: the mount that holds dir must be shared (its peers see
// what is mounted under it). In the plugin's container that is the state
// directory's hostPath mounted with Bidirectional propagation; with
// HostToContainer or None it is a slave or private.
func sharedMount(dir string) error {
	dir, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return err
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	defer f.Close() //nolint:errcheck // read-only
	return sharedIn(f, dir)
}

// sharedIn is sharedMount on a mount table in the format of
// /proc/self/mountinfo.
func sharedIn(mountinfo io.Reader, dir string) error {
	var point string
	var shared bool
	s := bufio.NewScanner(mountinfo)
	for s.Scan() {
		// ID parent major:minor root mount-point options [optional...] - type source super-options
		fields := strings.Fields(s.Text())
		if len(fields) < 7 {
			continue
		}
		p := unescapeMountInfo(fields[4])
		if !within(dir, p) || len(p) < len(point) {
			continue
		}
		// A later line for the same point is a mount on top of it.
		point, shared = p, false
		for _, opt := range fields[6:] {
			if opt == "-" {
				break
			}
			shared = shared || strings.HasPrefix(opt, "shared:")
		}
	}
	if err := s.Err(); err != nil {
		return err
	}
	if point == "" {
		return fmt.Errorf("no mount holds %s", dir)
	}
	if !shared {
		return fmt.Errorf("the mount %s that holds %s is not shared, so a tmpfs mounted there would not reach the container runtime (a containerised plugin needs Bidirectional mount propagation on its state directory)", point, dir)
	}
	return nil
}

func within(dir, point string) bool {
	return point == "/" || dir == point || strings.HasPrefix(dir, point+"/")
}

// unescapeMountInfo undoes the octal escapes (\040 for a space) of a path
// in /proc/self/mountinfo.
func unescapeMountInfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// preparePipeDir makes a daemon's pipe directory ready for it: there,
// mode 01777, empty. A new one (fresh: no daemon is recorded under its key,
// so no container has it mounted) gets a tmpfs of its own when bound is
// nil. One that containers may have mounted is emptied, not replaced: they
// would not see a new directory or a new mount.
func preparePipeDir(dir string, fresh bool, bound error) error {
	return prepareDir(dir, "prism-mps", PipeDirSize, pipeDirInodes, fresh, bound)
}

// prepareShmDir makes a daemon's shared-memory directory ready, as
// preparePipeDir its pipe directory: it is written by the share's MPS
// server and clients, whatever their UIDs, and by nobody else.
func prepareShmDir(dir string, fresh bool, bound error) error {
	return prepareDir(dir, "prism-mps-shm", ShmDirSize, shmDirInodes, fresh, bound)
}

func prepareDir(dir, source string, size, inodes int, fresh bool, bound error) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if fresh && bound == nil {
		mounted, err := mountpoint.Is(dir)
		if err != nil {
			return err
		}
		if !mounted {
			data := fmt.Sprintf("size=%d,nr_inodes=%d,mode=%o", size, inodes, pipeDirMode)
			if err := mount(source, dir, "tmpfs", pipeDirFlags, data); err != nil {
				return fmt.Errorf("mounting a %d-byte tmpfs on %s: %w", size, dir, err)
			}
		}
	}
	return emptyDir(dir)
}

// emptyDir makes dir exist, with mode 01777, and hold nothing.
func emptyDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// Not os.Chmod, whose mode 0o1777 would drop the sticky bit (it wants
	// os.ModeSticky); the umask does not apply to chmod.
	if err := unix.Chmod(dir, pipeDirMode); err != nil {
		return fmt.Errorf("chmod %s: %w", dir, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// removeDaemonDirs removes a daemon's directory, and all in it, after
// unmounting the tmpfs of its pipe and shared-memory directories:
// RemoveAll would empty a tmpfs, then fail on the mount point.
func removeDaemonDirs(dir string, mounts ...string) error {
	for _, m := range mounts {
		if m == "" {
			continue
		}
		if err := mountpoint.Unmount(m); err != nil {
			return err
		}
	}
	return os.RemoveAll(dir)
}

// checkControl says why the daemon cannot be reached through the control
// pipe in pipeDir, nil when it can. The pipe must be there, a named pipe
// or a socket (NVIDIA documents both in the pipe directory), and owned by
// the user the daemon runs as, the plugin's (root on a node): one that a
// tenant removed, or made in its place, is not the daemon's.
func checkControl(pipeDir string) error {
	path := filepath.Join(pipeDir, controlPipe)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("its control pipe %s is gone", path)
	} else if err != nil {
		return &fs.PathError{Op: "lstat", Path: path, Err: err}
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFIFO && t != unix.S_IFSOCK {
		return fmt.Errorf("its control pipe %s is not a pipe (mode %#o)", path, st.Mode)
	}
	if uid := uint32(os.Geteuid()); st.Uid != uid {
		return fmt.Errorf("its control pipe %s belongs to UID %d, not to the daemon's %d", path, st.Uid, uid)
	}
	return nil
}
