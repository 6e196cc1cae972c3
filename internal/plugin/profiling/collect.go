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
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/ncu"
	"github.com/prismgpu/prism/pkg/profile"
)

// Reason says why no usable report was collected. The values are valid
// condition reasons and end up on the WorkloadProfile.
type Reason string

const (
	// ReasonReportMissing: the container never ran under the shim (it did
	// not start, its entrypoint is statically linked, or another container
	// of the claim took the profile first without finishing).
	ReasonReportMissing Reason = "ReportMissing"
	// ReasonReportUnparseable: ncu wrote something that is not a usable
	// CSV report.
	ReasonReportUnparseable Reason = "ReportUnparseable"
	// ReasonProfilerFailed: the shim could not start ncu, or ncu reported
	// an error such as ERR_NVGPUCTRPERM.
	ReasonProfilerFailed Reason = "ProfilerFailed"
	// ReasonReportRejected: a file in the report directory is not a
	// regular file (a symbolic link, a FIFO, a directory), so it was not
	// read.
	ReasonReportRejected Reason = "ReportRejected"
	// ReasonReportTooLarge: the files in the report directory exceed what
	// the plugin reads for one claim.
	ReasonReportTooLarge Reason = "ReportTooLarge"
)

const (
	// collectBudget bounds what Collect reads from one claim directory, all
	// files together. Collect streams what it reads, so the budget bounds
	// time, not memory. A thousand launches of the full set stay far
	// below it.
	collectBudget = 64 << 20
	// collectTimeout bounds Collect, so that a slow disk or a report
	// built to be slow to parse cannot keep a collection worker for long.
	collectTimeout = 30 * time.Second
	// maxVersionBytes and maxErrorBytes are how much of the version and
	// shim error files is read: both are a few lines the plugin's own
	// binaries write, which the tenant can overwrite.
	maxVersionBytes = 4 << 10
	maxErrorBytes   = 64 << 10
)

// openFlags open a file of the tenant-writable directory without opening
// what it names: O_PATH runs no driver's open (a device node the tenant
// made, say /dev/watchdog's, is not armed) and does not wait for a FIFO's
// writer; O_NOFOLLOW opens a symbolic link itself, which fstat then
// rejects. The names opened are fixed single path components, so the
// final component is the only one resolved and openat with O_NOFOLLOW is
// as strict as openat2 with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, and works
// on kernels before 5.6. Only a regular file is then opened for reading.
const openFlags = unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC

// CollectError is returned by Collect when there is no usable report. Its
// message is written by the plugin alone: the files are the tenant's, and
// their contents never reach an error, a condition or a log line.
type CollectError struct {
	Reason Reason
	// Detail is the message for a human: what was found, with file names
	// and byte counts.
	Detail string
}

func (e *CollectError) Error() string {
	return fmt.Sprintf("%s: %s", e.Reason, e.Detail)
}

// Collect reads the report a profiled claim left in dir, a directory that
// Detach set aside, whose out directory its containers could write to, and
// summarises it into a WorkloadProfile status with opts, whose report
// field names the file read, its SHA-256 and size, so that the profile can
// be matched with the raw report in the archive. Only regular
// files are read, never through a symbolic link, all of them together
// within a fixed budget and time. Each is read once, as a stream: the
// hash, the size and the summary come from the same pass, and nothing
// holds the report. The error is a *CollectError when the report is
// missing or unusable.
func Collect(ctx context.Context, dir string, opts profile.Options) (*prismv1alpha1.WorkloadProfileStatus, error) {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("dir", dir)
	files, err := openClaimFiles(filepath.Join(dir, outDir))
	if err != nil {
		return nil, err
	}
	defer files.close()

	version, err := files.readHead(ctx, VersionFile, maxVersionBytes)
	if err != nil {
		return nil, err
	}
	if len(version) > 0 {
		// Scan looks for the version in lines above the CSV.
		version = append(bytes.TrimRight(version, "\n"), '\n')
	}
	// No CSV in report.csv: ncu.log either holds it (some ncu versions
	// print results into --log-file) or says why not.
	var seen [2]seenFile
	for i, name := range []string{ReportFile, LogFile} {
		st, err := files.summarize(ctx, name, version, opts, &seen[i])
		switch {
		case err == nil:
			logger.V(2).Info("Collected profile", "file", name, "bytes", st.Report.SizeBytes, "sha256", st.Report.SHA256)
			return st, nil
		case errors.Is(err, ncu.ErrNoTable):
			continue
		case ctx.Err() != nil:
			return nil, fmt.Errorf("collecting report in %s: %w", dir, ctx.Err())
		}
		if _, ok := errors.AsType[*CollectError](err); ok {
			return nil, err
		}
		// Not err: the parser may quote what it could not read.
		logger.V(2).Info("Report does not parse", "file", name, "bytes", seen[i].size)
		return nil, &CollectError{Reason: ReasonReportUnparseable,
			Detail: fmt.Sprintf("%s (%d bytes) is not an ncu CSV report with the required metrics", name, seen[i].size)}
	}
	// profile-error.txt says why the shim gave up.
	shimErr, err := files.readHead(ctx, ErrorFile, maxErrorBytes)
	if err != nil {
		return nil, err
	}
	return nil, noReport(seen[0], seen[1], shimErr)
}

// seenFile is what Collect learnt of a file without a CSV table.
type seenFile struct {
	exists bool
	size   int64
	// markers found in it, from ncuMarkers.
	marks markerScan
}

// ncuMarkers are the words in ncu's log that explain a missing report.
var ncuMarkers = [...]string{"ERR_NVGPUCTRPERM", "==ERROR=="}

// summarize reads one file as an ncu report, in one pass that also hashes
// it and looks for ncuMarkers. It returns ncu.ErrNoTable when the file is
// missing or holds no CSV line.
func (c *claimFiles) summarize(ctx context.Context, name string, version []byte, opts profile.Options, seen *seenFile) (*prismv1alpha1.WorkloadProfileStatus, error) {
	r, err := c.reader(ctx, name)
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, ncu.ErrNoTable
	}
	defer r.close()
	seen.exists, seen.size = true, r.size
	h := sha256.New()
	in := io.TeeReader(r, io.MultiWriter(h, &seen.marks))
	st, err := profile.FromReport(ctx, io.MultiReader(bytes.NewReader(version), in), opts)
	if err != nil {
		if tooLarge, ok := errors.AsType[*CollectError](r.err); ok {
			return nil, tooLarge
		}
		return nil, err
	}
	st.Report = &prismv1alpha1.ReportDigest{File: name, SHA256: hex.EncodeToString(h.Sum(nil)), SizeBytes: r.n}
	return &st, nil
}

// shimFailures are the reasons the shim writes to profile-error.txt. A
// match is reported with the plugin's copy of the words, so that nothing
// the tenant wrote is passed on.
var shimFailures = []string{
	"ncu is not executable",
	"reading the ncu arguments",
	"cannot name the program to profile",
	"profile directory path too long",
	"creating the report",
	"out of memory",
	"redirecting stdout",
	"starting ncu failed",
}

// noReport explains why there is no CSV, from markers in the files and
// their sizes.
func noReport(rep, ncuLog seenFile, shimErr []byte) *CollectError {
	switch {
	case len(shimErr) > 0:
		why := "for a reason it did not name"
		for _, f := range shimFailures {
			if bytes.Contains(shimErr, []byte(f)) {
				why = f
				break
			}
		}
		return &CollectError{Reason: ReasonProfilerFailed, Detail: fmt.Sprintf(
			"the profiler shim ran the workload without ncu: %s (%s, %d bytes, is kept in the node's profile archive)", why, ErrorFile, len(shimErr))}
	case ncuLog.marks.found(0):
		return &CollectError{Reason: ReasonProfilerFailed,
			Detail: "ncu could not read the GPU performance counters, which the NVIDIA driver restricts to administrators: " + permissionAdvice}
	case ncuLog.marks.found(1):
		return &CollectError{Reason: ReasonProfilerFailed, Detail: fmt.Sprintf(
			"ncu reported an error (%s, %d bytes, is kept in the node's profile archive)", LogFile, ncuLog.size)}
	case !rep.exists && !ncuLog.exists:
		return &CollectError{Reason: ReasonReportMissing,
			Detail: "no report: the container did not run under the profiler (not started yet, or a statically linked entrypoint that ignores the preload library)"}
	}
	return &CollectError{Reason: ReasonReportMissing, Detail: fmt.Sprintf(
		"neither %s (%d bytes) nor %s (%d bytes) holds an ncu CSV table", ReportFile, rep.size, LogFile, ncuLog.size)}
}

// markerScan records which of ncuMarkers occur in what is written to it,
// keeping only the bytes a marker could straddle between two writes.
type markerScan struct {
	seen [len(ncuMarkers)]bool
	tail []byte
}

func (m *markerScan) found(i int) bool { return m.seen[i] }

func (m *markerScan) Write(p []byte) (int, error) {
	const keep = 16 // longer than every marker
	edge := append(m.tail, p[:min(len(p), keep)]...)
	for i, mk := range ncuMarkers {
		m.seen[i] = m.seen[i] || bytes.Contains(edge, []byte(mk)) || bytes.Contains(p, []byte(mk))
	}
	if len(p) >= keep {
		m.tail = append(m.tail[:0], p[len(p)-keep:]...)
	} else {
		m.tail = append(m.tail, p...)
		m.tail = m.tail[max(0, len(m.tail)-keep):]
	}
	return len(p), nil
}

// claimFiles reads the fixed files of one claim directory beneath a handle
// on that directory, sharing one budget.
type claimFiles struct {
	dir  *os.File
	left int64
}

func openClaimFiles(dir string) (*claimFiles, error) {
	d, err := os.OpenFile(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return nil, &CollectError{Reason: ReasonReportMissing, Detail: "no report: the claim has no report directory"}
	}
	if err != nil {
		return nil, fmt.Errorf("opening report directory %s: %w", dir, err)
	}
	return &claimFiles{dir: d, left: collectBudget}, nil
}

func (c *claimFiles) close() {
	c.dir.Close() //nolint:errcheck // read-only
}

// fileReader reads one file of the claim directory within what is left of
// the budget, and stops between chunks once ctx is done.
type fileReader struct {
	ctx  context.Context
	c    *claimFiles
	f    *os.File
	name string
	// size is the file's size when it was opened; n counts what was read.
	size, n int64
	// err is the error that stopped the reading, if any.
	err error
}

// reader opens a regular file of the directory for reading, or returns nil
// when it does not exist. The file is opened by O_PATH first, so that only
// a regular file is ever opened for reading.
func (c *claimFiles) reader(ctx context.Context, name string) (*fileReader, error) {
	path := filepath.Join(c.dir.Name(), name)
	fd, err := unix.Openat(int(c.dir.Fd()), name, openFlags, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	defer unix.Close(fd) //nolint:errcheck // an O_PATH handle
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("inspecting %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, rejected(name, st.Mode)
	}
	if st.Size > c.left {
		return nil, c.tooLarge(name, st.Size)
	}
	// The handle's own file, whatever the name points to by now; O_NONBLOCK
	// and O_NOCTTY in case a kernel ever lets the type change under a handle.
	rd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", fd), unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening %s for reading: %w", path, err)
	}
	return &fileReader{ctx: ctx, c: c, f: os.NewFile(uintptr(rd), path), name: name, size: st.Size}, nil
}

// Read passes on what the budget allows, and fails with ReportTooLarge
// once the file holds more: the size may grow while reading.
func (r *fileReader) Read(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if err := r.ctx.Err(); err != nil {
		r.err = err
		return 0, err
	}
	if room := r.c.left - r.n + 1; int64(len(p)) > room {
		p = p[:room]
	}
	n, err := r.f.Read(p)
	if r.n+int64(n) > r.c.left {
		r.err = r.c.tooLarge(r.name, r.n+int64(n))
		return 0, r.err
	}
	r.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("reading %s: %w", r.f.Name(), err)
	}
	r.err = err
	return n, err
}

// close charges what was read to the budget.
func (r *fileReader) close() {
	r.c.left -= r.n
	r.f.Close() //nolint:errcheck // read-only
}

// readHead returns up to n bytes from the start of a file, nil when it does
// not exist.
func (c *claimFiles) readHead(ctx context.Context, name string, n int64) ([]byte, error) {
	r, err := c.reader(ctx, name)
	if err != nil || r == nil {
		return nil, err
	}
	defer r.close()
	data, err := io.ReadAll(io.LimitReader(r, n))
	if err != nil {
		return nil, err
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

func (c *claimFiles) tooLarge(name string, size int64) *CollectError {
	return &CollectError{Reason: ReasonReportTooLarge, Detail: fmt.Sprintf(
		"%s has at least %d bytes, more than the %d bytes left of the %d-byte budget for one claim's report", name, size, c.left, collectBudget)}
}

func rejected(name string, mode uint32) *CollectError {
	if mode&unix.S_IFMT == unix.S_IFLNK {
		return &CollectError{Reason: ReasonReportRejected, Detail: name + " is a symbolic link; only regular files are read"}
	}
	return &CollectError{Reason: ReasonReportRejected, Detail: fmt.Sprintf("%s is not a regular file (%s); only regular files are read", name, fileType(mode))}
}

func fileType(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return fmt.Sprintf("type %#o", mode&unix.S_IFMT)
}
