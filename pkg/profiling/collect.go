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

	"github.com/prismgpu/prism/pkg/ncu"
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
	// files together: the tenant can write there, and the plugin's memory
	// limit is shared by every claim on the node. A thousand launches of
	// the full set stay far below it.
	collectBudget = 64 << 20
	// collectTimeout bounds Collect, so that a slow disk cannot hold the
	// claim's unprepare for long.
	collectTimeout = 30 * time.Second
)

// openFlags open a file of the tenant-writable directory. O_NOFOLLOW
// refuses a symbolic link, which could name a host file the plugin can
// read; O_NONBLOCK keeps the open of a FIFO from waiting for a writer. The
// names opened are fixed single path components, so the final component is
// the only one resolved and openat with O_NOFOLLOW is as strict as openat2
// with RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS, and works on kernels before 5.6.
const openFlags = unix.O_RDONLY | unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_NOCTTY | unix.O_CLOEXEC

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

// Report is a collected ncu report.
type Report struct {
	// CSV is the report with the recorded "ncu --version" output above
	// it, which is where pkg/ncu looks for the version.
	CSV []byte
	// File is the file the CSV was read from: report.csv, or ncu.log when
	// ncu printed its results there. The archive keeps it.
	File string
	// SHA256 (hex) and Size are those of File as collected, so that a
	// profile can be matched with the raw report in the archive.
	SHA256 string
	Size   int64
}

// Collect reads the report a profiled claim left in dir, a directory that
// Detach set aside, whose out directory its containers could write to. Only regular files are read,
// never through a symbolic link, all of them together within a fixed
// budget and time. The error is a *CollectError when the report is missing
// or unusable.
func Collect(ctx context.Context, dir string) (*Report, error) {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	logger := klog.FromContext(ctx).WithValues("dir", dir)
	files, err := openClaimFiles(filepath.Join(dir, outDir))
	if err != nil {
		return nil, err
	}
	defer files.close()

	rep, err := files.read(ctx, ReportFile)
	if err != nil {
		return nil, err
	}
	source := ReportFile
	if !hasCSV(rep) {
		// No CSV: ncu.log either holds it (some ncu versions print results
		// into --log-file) or says why not, and profile-error.txt says
		// why the shim gave up.
		ncuLog, err := files.read(ctx, LogFile)
		if err != nil {
			return nil, err
		}
		if !hasCSV(ncuLog) {
			shimErr, err := files.read(ctx, ErrorFile)
			if err != nil {
				return nil, err
			}
			return nil, noReport(rep, ncuLog, shimErr)
		}
		logger.V(4).Info("Taking the report from the ncu log")
		rep, source = ncuLog, LogFile
	}
	sum := sha256.Sum256(rep)
	out := &Report{File: source, SHA256: hex.EncodeToString(sum[:]), Size: int64(len(rep))}

	version, err := files.read(ctx, VersionFile)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("collecting report in %s: %w", dir, err)
	}
	// Parsing here, not only later in profile.ForClaim, so that a bad
	// report carries its reason to the caller.
	if _, err := ncu.Parse(ctx, bytes.NewReader(rep)); err != nil {
		logger.V(2).Info("Report does not parse", "file", source, "bytes", len(rep))
		return nil, &CollectError{Reason: ReasonReportUnparseable,
			Detail: fmt.Sprintf("%s (%d bytes) is not an ncu CSV report with the required metrics", source, len(rep))}
	}
	if len(version) > 0 {
		rep = append(append(bytes.TrimRight(version, "\n"), '\n'), rep...)
	}
	out.CSV = rep
	logger.V(2).Info("Collected profile", "file", source, "bytes", out.Size, "sha256", out.SHA256)
	return out, nil
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
func noReport(rep, ncuLog, shimErr []byte) *CollectError {
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
	case bytes.Contains(ncuLog, []byte("ERR_NVGPUCTRPERM")):
		return &CollectError{Reason: ReasonProfilerFailed,
			Detail: "ncu could not read the GPU performance counters, which the NVIDIA driver restricts to administrators: " + permissionAdvice}
	case bytes.Contains(ncuLog, []byte("==ERROR==")):
		return &CollectError{Reason: ReasonProfilerFailed, Detail: fmt.Sprintf(
			"ncu reported an error (%s, %d bytes, is kept in the node's profile archive)", LogFile, len(ncuLog))}
	case rep == nil && ncuLog == nil:
		return &CollectError{Reason: ReasonReportMissing,
			Detail: "no report: the container did not run under the profiler (not started yet, or a statically linked entrypoint that ignores the preload library)"}
	}
	return &CollectError{Reason: ReasonReportMissing, Detail: fmt.Sprintf(
		"neither %s (%d bytes) nor %s (%d bytes) holds an ncu CSV table", ReportFile, len(rep), LogFile, len(ncuLog))}
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

// read returns the content of a regular file, nil when it does not exist.
func (c *claimFiles) read(ctx context.Context, name string) ([]byte, error) {
	path := filepath.Join(c.dir.Name(), name)
	fd, err := unix.Openat(int(c.dir.Fd()), name, openFlags, 0)
	switch {
	case errors.Is(err, unix.ENOENT):
		return nil, nil
	case errors.Is(err, unix.ELOOP):
		return nil, &CollectError{Reason: ReasonReportRejected, Detail: name + " is a symbolic link; only regular files are read"}
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close() //nolint:errcheck // read-only
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("inspecting %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, &CollectError{Reason: ReasonReportRejected, Detail: fmt.Sprintf("%s is not a regular file (%s); only regular files are read", name, fileType(fi.Mode()))}
	}
	if fi.Size() > c.left {
		return nil, c.tooLarge(name, fi.Size())
	}
	// The size may grow while reading; the limit holds regardless.
	data, err := io.ReadAll(io.LimitReader(ctxReader{ctx, f}, c.left+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if int64(len(data)) > c.left {
		return nil, c.tooLarge(name, int64(len(data)))
	}
	c.left -= int64(len(data))
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

func (c *claimFiles) tooLarge(name string, size int64) *CollectError {
	return &CollectError{Reason: ReasonReportTooLarge, Detail: fmt.Sprintf(
		"%s has at least %d bytes, more than the %d bytes left of the %d-byte budget for one claim's report", name, size, c.left, collectBudget)}
}

func fileType(m os.FileMode) string {
	switch {
	case m&os.ModeDir != 0:
		return "a directory"
	case m&os.ModeNamedPipe != 0:
		return "a FIFO"
	case m&os.ModeSocket != 0:
		return "a socket"
	case m&os.ModeDevice != 0:
		return "a device"
	}
	return "type " + m.Type().String()
}

// ctxReader stops a read between chunks once ctx is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (r ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.r.Read(p)
}

// hasCSV tells whether ncu printed any CSV line; its CSV lines are quoted,
// its own messages and the application's output are not. It scans in
// place: the input may be most of the budget.
func hasCSV(b []byte) bool {
	for len(b) > 0 {
		line, rest, _ := bytes.Cut(b, []byte("\n"))
		if bytes.HasPrefix(bytes.TrimSpace(line), []byte(`"`)) {
			return true
		}
		b = rest
	}
	return false
}
