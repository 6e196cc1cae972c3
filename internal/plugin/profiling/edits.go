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
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/atomicfile"
	"github.com/prismgpu/prism/pkg/ncu"
)

// Paths inside the container. They are fixed so that a report, a log line
// or a support request means the same thing on every node.
const (
	// ContainerNCUDir is where the host's Nsight Compute install directory
	// is mounted, read-only.
	ContainerNCUDir = "/opt/prism/ncu"
	// ContainerProfileDir is where the claim's report directory is
	// mounted, read-write.
	ContainerProfileDir = "/var/run/prism/profile"
	// ContainerShimPath is where the preload library is mounted.
	ContainerShimPath = "/opt/prism/lib/" + ShimName
	// ContainerPreloadList is the dynamic loader's list of libraries to
	// preload into every program. Prism loads the shim through it rather
	// than LD_PRELOAD: a CDI environment edit replaces the variable, and
	// with it a workload's own preload (jemalloc, tcmalloc), while the
	// loader reads this file in addition to LD_PRELOAD.
	ContainerPreloadList = "/etc/ld.so.preload"
)

// Environment variables the shim reads. The CDI edits set them to the
// container paths above; the shim takes every path from them.
const (
	EnvNCU        = "PRISM_NCU"
	EnvNCUArgs    = "PRISM_NCU_ARGS_FILE"
	EnvProfileDir = "PRISM_PROFILE_DIR"
	// EnvActive is set by the shim in the process it profiles, so that the
	// target and its children are never profiled again.
	EnvActive = "PRISM_PROFILE_ACTIVE"
	// EnvMatch may be set in the pod spec to profile the first process
	// with this executable name instead of the entrypoint.
	EnvMatch = "PRISM_PROFILE_MATCH"
)

// Files in a claim's profile directory.
const (
	ArgsFile    = "ncu.args"
	ReportFile  = "report.csv"
	LogFile     = "ncu.log"
	ErrorFile   = "profile-error.txt"
	VersionFile = "ncu-version.txt"
)

const (
	profilesDir = "profiles"
	// preloadFile, in the profiles directory, is mounted as
	// ContainerPreloadList. It names only the shim.
	preloadFile = "ld.so.preload"
	ncuBinary   = "ncu"
	// versionTimeout bounds "ncu --version" at prepare; it never touches a
	// GPU and answers in well under a second.
	versionTimeout = 10 * time.Second
)

// ErrUnavailable is wrapped by Prepare when the host lacks ncu or the shim.
// The container would fail to start with a missing mount source, so the
// caller decides between failing prepare and running without profiling.
var ErrUnavailable = errors.New("profiler unavailable on this node")

// defaultMetrics are what the classification in pkg/profile reads: the
// speed-of-light throughputs, occupancy, waves, DRAM traffic, duration and
// FP32 instruction counts for the roofline check.
var defaultMetrics = []string{
	ncu.MetricSMThroughput,
	ncu.MetricMemoryThroughput,
	ncu.MetricDRAMThroughput,
	ncu.MetricL2Throughput,
	ncu.MetricAchievedOccupancy,
	ncu.MetricWavesPerSM,
	ncu.MetricDRAMBytes,
	ncu.MetricDuration,
	ncu.MetricFAdd,
	ncu.MetricFMul,
	ncu.MetricFFMA,
}

// requiredMetrics are added to a user's metric list: without them a report
// cannot become a profile.
var requiredMetrics = []string{ncu.MetricSMThroughput, ncu.MetricMemoryThroughput, ncu.MetricDuration}

// The API validates these already; they are checked again because the
// values end up on a command line, and this package must be safe on its
// own.
var (
	metricRE       = lazyRegexp(`^[a-z0-9_.]+$`)
	kernelFilterRE = lazyRegexp(`^(regex:)?[A-Za-z0-9_.:+][A-Za-z0-9_.:+-]*$`)
	claimUIDRE     = lazyRegexp(`^[A-Za-z0-9][A-Za-z0-9-]{0,62}$`)
)

// lazyRegexp compiles on first use: most nodes never profile, and the
// {0,62} repetitions above compile to programs that every plugin process
// would otherwise build at start-up and keep (about 130 KB of heap for
// this package, GODEBUG=inittrace=1).
func lazyRegexp(expr string) func() *regexp.Regexp {
	return sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(expr) })
}

// Options say where things are on the host.
type Options struct {
	// StateDir is the plugin's state directory; reports go to
	// <StateDir>/profiles/<claimUID>.
	StateDir string
	// NCUDir is the host's Nsight Compute install directory, holding the
	// ncu launcher.
	NCUDir string
	// ShimPath is the host path of the compiled libprism-profile.so.
	ShimPath string
	// DirSize bounds, in bytes, what a claim's containers may write into
	// their report directory, a tmpfs of that size. Zero leaves the
	// directory on the state directory's file system, unbounded; see
	// CheckQuota.
	DirSize int64
}

// Available reports whether ncu and the shim are where opts says; the error
// wraps ErrUnavailable and names what is missing.
func Available(opts Options) error {
	if opts.NCUDir == "" {
		return fmt.Errorf("%w: no Nsight Compute directory configured (prism-kubelet-plugin --ncu-path)", ErrUnavailable)
	}
	for _, p := range []string{filepath.Join(opts.NCUDir, ncuBinary), opts.ShimPath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%w: %w", ErrUnavailable, err)
		}
	}
	return nil
}

// ClaimDir is the host directory of a claim's report, which its containers
// mount.
func ClaimDir(stateDir, claimUID string) string {
	return filepath.Join(claimRoot(stateDir, claimUID), outDir)
}

// claimRoot holds ClaimDir; it is the plugin's alone.
func claimRoot(stateDir, claimUID string) string {
	return filepath.Join(stateDir, profilesDir, claimUID)
}

// Prepare readies profiling for a claim and returns the CDI edits that
// make the claim's containers run under ncu. It returns nil edits when the
// configuration does not enable profiling. Calling it again for the same
// claim rewrites the argument file and keeps any report already taken.
func Prepare(ctx context.Context, opts Options, claimUID string, cfg *gpuv1alpha1.GpuProfiling) (*cdispec.ContainerEdits, error) {
	if cfg == nil || !cfg.Enabled {
		return nil, nil
	}
	logger := klog.FromContext(ctx).WithValues("claimUID", claimUID)
	if err := validateClaimUID(claimUID); err != nil {
		return nil, err
	}
	args, err := ncuArgs(cfg)
	if err != nil {
		return nil, fmt.Errorf("profiling claim %s: %w", claimUID, err)
	}
	if err := Available(opts); err != nil {
		return nil, fmt.Errorf("profiling claim %s: %w", claimUID, err)
	}
	ncuPath := filepath.Join(opts.NCUDir, ncuBinary)

	root, err := ensureProfilesRoot(opts.StateDir)
	if err != nil {
		return nil, fmt.Errorf("profiling claim %s: %w", claimUID, err)
	}
	preload := filepath.Join(root, preloadFile)
	if err := atomicfile.WriteFile(preload, []byte(ContainerShimPath+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("writing the preload list: %w", err)
	}
	dir := ClaimDir(opts.StateDir, claimUID)
	if err := os.MkdirAll(dir, profilesMode); err != nil {
		return nil, fmt.Errorf("creating profile directory: %w", err)
	}
	if opts.DirSize > 0 {
		if err := mountQuota(dir, opts.DirSize); err != nil {
			return nil, fmt.Errorf("profiling claim %s: %w", claimUID, err)
		}
	}
	// World-writable, because the plugin cannot know the container's user:
	// the image's USER applies when the pod names none, and a pod in a
	// user namespace maps every host owner to nobody. The world is small:
	// the parents are root's alone (profilesMode), and only this claim's
	// containers mount the directory. Collect reads it as untrusted.
	if err := os.Chmod(dir, 0o777); err != nil {
		return nil, fmt.Errorf("opening profile directory %s to the container: %w", dir, err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, ArgsFile), []byte(strings.Join(args, "\n")+"\n"), 0o644); err != nil {
		return nil, fmt.Errorf("writing ncu arguments: %w", err)
	}
	recordVersion(ctx, ncuPath, dir)

	edits := &cdispec.ContainerEdits{
		Env: []string{
			EnvNCU + "=" + ContainerNCUDir + "/" + ncuBinary,
			EnvNCUArgs + "=" + ContainerProfileDir + "/" + ArgsFile,
			EnvProfileDir + "=" + ContainerProfileDir,
		},
		Mounts: []*cdispec.Mount{
			{HostPath: opts.NCUDir, ContainerPath: ContainerNCUDir, Type: "bind", Options: []string{"ro", "nosuid", "nodev", "rbind"}},
			{HostPath: opts.ShimPath, ContainerPath: ContainerShimPath, Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"}},
			{HostPath: preload, ContainerPath: ContainerPreloadList, Type: "bind", Options: []string{"ro", "nosuid", "nodev", "bind"}},
			{HostPath: dir, ContainerPath: ContainerProfileDir, Type: "bind", Options: []string{"rw", "nosuid", "nodev", "noexec", "bind"}},
		},
	}
	logger.V(2).Info("Prepared profiling", "dir", dir, "args", args)
	return edits, nil
}

// ncuArgs turns the configuration into ncu options, one element per
// argument. The result is written to a file and passed to execv; it never
// goes through a shell.
func ncuArgs(cfg *gpuv1alpha1.GpuProfiling) ([]string, error) {
	// ncu locks the GPU's clocks to base for stable numbers by default;
	// on a GPU that other claims may use at the same time (time-slicing,
	// memory shares, MPS) that would slow their work too.
	args := []string{"--csv", "--page", "raw", "--clock-control", "none"}
	metrics := defaultMetrics
	switch {
	case len(cfg.Metrics) > 0:
		metrics = append([]string(nil), cfg.Metrics...)
		for _, m := range requiredMetrics {
			if !slices.Contains(metrics, m) {
				metrics = append(metrics, m)
			}
		}
	case cfg.Set != "" && cfg.Set != gpuv1alpha1.BasicProfilingSet:
		// ncu collects the set's sections and the listed metrics; the list
		// keeps the columns classification needs in the raw page whatever
		// the set holds. "basic" is the default and means Prism's list
		// alone, which is smaller than ncu's basic set and has the FP32
		// counters it lacks.
		args = append(args, "--set", string(cfg.Set))
	}
	for _, m := range metrics {
		if !metricRE().MatchString(m) {
			return nil, fmt.Errorf("invalid metric name %q", m)
		}
	}
	args = append(args, "--metrics", strings.Join(metrics, ","))

	launches := int32(gpuv1alpha1.MinLaunchCount)
	if cfg.LaunchCount != nil {
		launches = *cfg.LaunchCount
	}
	if launches < gpuv1alpha1.MinLaunchCount || launches > gpuv1alpha1.MaxLaunchCount {
		return nil, fmt.Errorf("launch count %d out of range [%d, %d]", launches, gpuv1alpha1.MinLaunchCount, gpuv1alpha1.MaxLaunchCount)
	}
	args = append(args, "--launch-count", strconv.Itoa(int(launches)))

	if f := cfg.KernelFilter; f != "" {
		if !kernelFilterRE().MatchString(f) {
			return nil, fmt.Errorf("invalid kernel filter %q", f)
		}
		// ncu understands the same "regex:" prefix as the API.
		args = append(args, "--kernel-name", f)
	}
	return args, nil
}

// recordVersion keeps "ncu --version" next to the report: metric names and
// definitions change between versions, and the parser picks the version up
// from text above the CSV. Failing here costs only that field.
func recordVersion(ctx context.Context, ncuPath, dir string) {
	logger := klog.FromContext(ctx)
	ctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, ncuPath, "--version").Output()
	if err != nil {
		logger.Info("Could not record the ncu version", "ncu", ncuPath, "err", err)
		return
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, VersionFile), out, 0o644); err != nil {
		logger.Info("Could not record the ncu version", "err", err)
	}
}

func validateClaimUID(uid string) error {
	// The UID becomes a path element.
	if !claimUIDRE().MatchString(uid) {
		return fmt.Errorf("invalid claim UID %q", uid)
	}
	return nil
}
