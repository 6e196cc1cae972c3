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
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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
)

const (
	// maxReportSize bounds what is read into memory; a thousand launches
	// of the full set stay far below it.
	maxReportSize = 64 << 20
	// maxTail is how much of a log goes into an error message and from
	// there into a condition (whose message is limited to 32 KiB).
	maxTail = 2048
)

// CollectError is returned by Collect when there is no usable report.
type CollectError struct {
	Reason Reason
	// Detail is the message for a human: what was found, with the tail of
	// ncu.log or profile-error.txt when they explain it.
	Detail string
	// Err is the underlying error, if any.
	Err error
}

func (e *CollectError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("%s: %s: %v", e.Reason, e.Detail, e.Err)
	}
	return fmt.Sprintf("%s: %s", e.Reason, e.Detail)
}

func (e *CollectError) Unwrap() error { return e.Err }

// Collect reads the report of a claim. The report is returned with the
// recorded "ncu --version" output above the CSV, which is where pkg/ncu
// looks for the version. ncuLog is returned whenever it exists, also
// together with an error, for the caller's log. The error is a
// *CollectError when the report is missing or unusable.
func Collect(ctx context.Context, stateDir, claimUID string) (report []byte, ncuLog []byte, err error) {
	if err := validateClaimUID(claimUID); err != nil {
		return nil, nil, err
	}
	dir := ClaimDir(stateDir, claimUID)
	logger := klog.FromContext(ctx).WithValues("claimUID", claimUID, "dir", dir)

	ncuLog, err = readOptional(filepath.Join(dir, LogFile))
	if err != nil {
		return nil, nil, err
	}
	shimErr, err := readOptional(filepath.Join(dir, ErrorFile))
	if err != nil {
		return nil, ncuLog, err
	}
	rep, err := readOptional(filepath.Join(dir, ReportFile))
	if err != nil {
		return nil, ncuLog, err
	}
	version, err := readOptional(filepath.Join(dir, VersionFile))
	if err != nil {
		return nil, ncuLog, err
	}

	// Some ncu versions print results into --log-file instead of stdout;
	// take the CSV from wherever it is.
	if !hasCSV(rep) && hasCSV(ncuLog) {
		logger.V(4).Info("Taking the report from the ncu log")
		rep = ncuLog
	}
	switch {
	case len(shimErr) > 0 && !hasCSV(rep):
		return nil, ncuLog, &CollectError{Reason: ReasonProfilerFailed, Detail: tail(shimErr)}
	case bytes.Contains(ncuLog, []byte("==ERROR==")) && !hasCSV(rep):
		detail := "ncu failed: " + tail(ncuLog)
		if bytes.Contains(ncuLog, []byte("ERR_NVGPUCTRPERM")) {
			detail = "GPU performance counters are restricted to administrators: " + permissionAdvice + "; " + detail
		}
		return nil, ncuLog, &CollectError{Reason: ReasonProfilerFailed, Detail: detail}
	case rep == nil && ncuLog == nil:
		return nil, nil, &CollectError{Reason: ReasonReportMissing,
			Detail: "no report in " + dir + ": the container did not run under the profiler (not started yet, or a statically linked entrypoint that ignores LD_PRELOAD)"}
	case !hasCSV(rep):
		detail := "the report holds no CSV"
		if len(ncuLog) > 0 {
			detail += "; ncu.log ends with: " + tail(ncuLog)
		}
		return nil, ncuLog, &CollectError{Reason: ReasonReportMissing, Detail: detail}
	}

	// Parsing here, not only later in profile.ForClaim, so that a bad
	// report carries its reason to the caller.
	if _, err := ncu.Parse(ctx, bytes.NewReader(rep)); err != nil {
		return nil, ncuLog, &CollectError{Reason: ReasonReportUnparseable, Detail: "parsing " + ReportFile, Err: err}
	}
	if len(version) > 0 {
		rep = append(append(bytes.TrimRight(version, "\n"), '\n'), rep...)
	}
	logger.V(2).Info("Collected profile", "bytes", len(rep))
	return rep, ncuLog, nil
}

// readOptional reads a file that may legitimately be absent (nil, nil).
func readOptional(path string) ([]byte, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	defer f.Close() //nolint:errcheck // read-only
	data, err := io.ReadAll(io.LimitReader(f, maxReportSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if len(data) > maxReportSize {
		return nil, &CollectError{Reason: ReasonReportUnparseable, Detail: fmt.Sprintf("%s is larger than %d bytes", path, maxReportSize)}
	}
	if data == nil {
		data = []byte{}
	}
	return data, nil
}

// hasCSV tells whether ncu printed any CSV line; its CSV lines are quoted,
// its own messages and the application's output are not.
func hasCSV(b []byte) bool {
	s := bufio.NewScanner(bytes.NewReader(b))
	s.Buffer(make([]byte, 0, 64<<10), maxReportSize)
	for s.Scan() {
		if strings.HasPrefix(strings.TrimSpace(s.Text()), `"`) {
			return true
		}
	}
	return false
}

// tail keeps the end of a log, where the reason for a failure is.
func tail(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > maxTail {
		b = b[len(b)-maxTail:]
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		}
		return "..." + string(b)
	}
	return string(b)
}
