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
	"bufio"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2/ktesting"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

const testDirSize = 1 << 20

// quotaHost is fakeHost with report directories bounded by a tmpfs. Tests
// using it mount file systems, which needs root: as root a failing mount is
// a failure, not a reason to skip.
func quotaHost(t *testing.T) Options {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	opts := fakeHost(t)
	opts.DirSize = testDirSize
	unmountAtCleanup(t, opts.StateDir)
	return opts
}

// unmountAtCleanup unmounts what a failing test left mounted under dir
// before its temporary directory is removed, which the mount would stop.
func unmountAtCleanup(t *testing.T, dir string) {
	t.Cleanup(func() {
		for _, m := range mountsUnder(t, dir) {
			if err := unix.Unmount(m, unix.MNT_DETACH); err != nil {
				t.Errorf("unmounting %s left by the test: %v", m, err)
			}
		}
	})
}

// mountsUnder lists the mount points in and under dir, from the kernel's
// own table.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close() //nolint:errcheck // read-only
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID parent major:minor root mountpoint options ...
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			out = append(out, fields[4])
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func prepareProfiled(t *testing.T, opts Options, uid string) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	if _, err := Prepare(ctx, opts, uid, &gpuv1alpha1.GpuProfiling{Enabled: true}); err != nil {
		t.Fatalf("Prepare(%s): %v", uid, err)
	}
}

// TestQuotaBoundsWhatAClaimWrites: the directory a profiled container
// writes to holds DirSize bytes, on a file system of its own that runs and
// opens no devices, and a second prepare of the claim keeps what is there.
func TestQuotaBoundsWhatAClaimWrites(t *testing.T) {
	opts := quotaHost(t)
	prepareProfiled(t, opts, testClaimUID)
	dir := ClaimDir(opts.StateDir, testClaimUID)

	if got := mountsUnder(t, opts.StateDir); !reflect.DeepEqual(got, []string{dir}) {
		t.Fatalf("mounts under the state directory: %q, want the claim's report directory alone", got)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC {
		t.Errorf("report directory is on file system type %#x, want tmpfs", fs.Type)
	}
	if want := unix.ST_NOSUID | unix.ST_NODEV | unix.ST_NOEXEC; fs.Flags&int64(want) != int64(want) {
		t.Errorf("report directory mounted with flags %#x, want nosuid, nodev and noexec", fs.Flags)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o777 {
		t.Errorf("report directory: %v, %v; want mode 0777 so that any container user can write", st.Mode().Perm(), err)
	}
	if _, err := os.Stat(filepath.Join(dir, ArgsFile)); err != nil {
		t.Errorf("ncu arguments not on the tmpfs the container mounts: %v", err)
	}

	if err := os.WriteFile(filepath.Join(dir, "filler"), make([]byte, 2*testDirSize), 0o644); !errors.Is(err, unix.ENOSPC) {
		t.Errorf("writing twice the quota: %v, want ENOSPC", err)
	}
	if err := os.Remove(filepath.Join(dir, "filler")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, ReportFile), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	prepareProfiled(t, opts, testClaimUID)
	if got := mountsUnder(t, opts.StateDir); !reflect.DeepEqual(got, []string{dir}) {
		t.Errorf("mounts after preparing the claim again: %q, want one", got)
	}
	if data, err := os.ReadFile(filepath.Join(dir, ReportFile)); err != nil || string(data) != "kept" {
		t.Errorf("preparing the claim again lost what its containers wrote: %q, %v", data, err)
	}
}

// TestQuotaMovesWithTheClaim: Detach renames the claim directory with the
// tmpfs mounted in it, Collect reads the report there, and Archive keeps
// the report's files on disk and unmounts the tmpfs.
func TestQuotaMovesWithTheClaim(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	opts := quotaHost(t)
	prepareProfiled(t, opts, testClaimUID)
	report := fixture(t, "vectoradd_raw.csv")
	if err := os.WriteFile(filepath.Join(ClaimDir(opts.StateDir, testClaimUID), ReportFile), report, 0o644); err != nil {
		t.Fatal(err)
	}

	dir, err := Detach(opts.StateDir, jobFor(testClaimUID))
	if err != nil {
		t.Fatalf("Detach of a claim directory holding a mount point: %v", err)
	}
	if got, want := mountsUnder(t, opts.StateDir), []string{filepath.Join(dir, outDir)}; !reflect.DeepEqual(got, want) {
		t.Errorf("mounts after Detach: %q, want %q", got, want)
	}
	got, err := Collect(ctx, dir, profile.Options{})
	if err != nil {
		t.Fatalf("Collect: %v", err)
	}
	if d := got.Report; d == nil || d.File != ReportFile || d.SizeBytes != int64(len(report)) {
		t.Errorf("collected %+v, want %s of %d bytes", d, ReportFile, len(report))
	}

	if err := Archive(ctx, opts.StateDir, dir, 5); err != nil {
		t.Fatalf("Archive: %v", err)
	}
	if got := mountsUnder(t, opts.StateDir); len(got) != 0 {
		t.Errorf("mounts after Archive: %q, want none", got)
	}
	archived := filepath.Join(opts.StateDir, profilesDir, archiveDir, filepath.Base(dir))
	names := dirNames(t, archived)
	if want := []string{ArgsFile, VersionFile, ReportFile, jobFile}; !reflect.DeepEqual(names, slices.Sorted(slices.Values(want))) {
		t.Errorf("archive holds %q, want %q", names, want)
	}
	if data, err := os.ReadFile(filepath.Join(archived, ReportFile)); err != nil || len(data) != len(report) {
		t.Errorf("archived report: %d bytes, %v; want %d", len(data), err, len(report))
	}
}

// TestQuotaUnmountedWithoutCollecting: the tmpfs of a claim released as
// stale, of one the checkpoint lost, and of one an older plugin (which
// wrote no job) stopped while collecting are unmounted, not left holding
// memory on the node. One set aside with its job stays for PendingJobs.
func TestQuotaUnmountedWithoutCollecting(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	opts := quotaHost(t)
	for _, uid := range []string{"stale-uid", "lost-uid", "interrupted-uid", "old-plugin-uid", "prepared-uid"} {
		prepareProfiled(t, opts, uid)
	}
	interrupted, err := Detach(opts.StateDir, jobFor("interrupted-uid"))
	if err != nil {
		t.Fatal(err)
	}
	oldPlugin, err := Detach(opts.StateDir, jobFor("old-plugin-uid"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(oldPlugin, jobFile)); err != nil {
		t.Fatal(err)
	}

	if err := DiscardClaimDir(opts.StateDir, "stale-uid"); err != nil {
		t.Fatalf("DiscardClaimDir: %v", err)
	}
	if err := SweepClaimDirs(ctx, opts.StateDir, func(uid string) bool { return uid == "prepared-uid" }); err != nil {
		t.Fatalf("SweepClaimDirs: %v", err)
	}
	if diff := cmp.Diff([]string{ClaimDir(opts.StateDir, "prepared-uid"), filepath.Join(interrupted, outDir)}, mountsUnder(t, opts.StateDir), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("mounts left (-want +got):\n%s", diff)
	}
	jobs, err := PendingJobs(opts.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	want := jobFor("interrupted-uid")
	want.Dir = interrupted
	if diff := cmp.Diff([]Job{want}, jobs); diff != "" {
		t.Errorf("pending jobs (-want +got):\n%s", diff)
	}
	if _, err := os.Lstat(oldPlugin); !os.IsNotExist(err) {
		t.Errorf("directory an older plugin set aside still there: %v", err)
	}
	for _, uid := range []string{"stale-uid", "lost-uid"} {
		if _, err := os.Lstat(claimRoot(opts.StateDir, uid)); !os.IsNotExist(err) {
			t.Errorf("claim directory of %s still there: %v", uid, err)
		}
	}
}

// TestQuotaNotPermitted: where the plugin may not mount, CheckQuota says
// so, and without a DirSize a claim's report directory is a plain one that
// Detach, Collect, Archive and DiscardClaimDir handle without unmounting
// anything (an unprivileged plugin may not even try).
func TestQuotaNotPermitted(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	mount = func(string, string, string, uintptr, string) error { return unix.EPERM }
	t.Cleanup(func() { mount = unix.Mount })
	opts := fakeHost(t)

	if err := CheckQuota(opts.StateDir); !errors.Is(err, unix.EPERM) {
		t.Errorf("CheckQuota: %v, want EPERM", err)
	}
	if _, err := os.Lstat(filepath.Join(opts.StateDir, profilesDir, probeDir)); !os.IsNotExist(err) {
		t.Errorf("CheckQuota left its probe directory: %v", err)
	}
	opts.DirSize = testDirSize
	if _, err := Prepare(ctx, opts, testClaimUID, &gpuv1alpha1.GpuProfiling{Enabled: true}); !errors.Is(err, unix.EPERM) {
		t.Errorf("Prepare with a quota it cannot mount: %v, want EPERM rather than an unbounded directory", err)
	}

	opts.DirSize = 0
	for _, uid := range []string{"collected-uid", "discarded-uid"} {
		prepareProfiled(t, opts, uid)
	}
	if err := os.WriteFile(filepath.Join(ClaimDir(opts.StateDir, "collected-uid"), ReportFile), fixture(t, "vectoradd_raw.csv"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir, err := Detach(opts.StateDir, jobFor("collected-uid"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Collect(ctx, dir, profile.Options{}); err != nil {
		t.Errorf("Collect: %v", err)
	}
	if err := Archive(ctx, opts.StateDir, dir, 5); err != nil {
		t.Errorf("Archive: %v", err)
	}
	if err := DiscardClaimDir(opts.StateDir, "discarded-uid"); err != nil {
		t.Errorf("DiscardClaimDir: %v", err)
	}
}

// TestCheckQuota: a plugin that may mount can bound report directories,
// and the check leaves nothing behind.
func TestCheckQuota(t *testing.T) {
	opts := quotaHost(t)
	if err := CheckQuota(opts.StateDir); err != nil {
		t.Fatalf("CheckQuota as root: %v", err)
	}
	if got := mountsUnder(t, opts.StateDir); len(got) != 0 {
		t.Errorf("mounts left by CheckQuota: %q", got)
	}
	if _, err := os.Lstat(filepath.Join(opts.StateDir, profilesDir, probeDir)); !os.IsNotExist(err) {
		t.Errorf("CheckQuota left its probe directory: %v", err)
	}
}
