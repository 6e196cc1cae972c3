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

package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
)

// fakeProfilingHost makes the ncu install and shim a profiled claim's
// prepare checks for.
func fakeProfilingHost(t *testing.T, dir string) profiling.Options {
	t.Helper()
	ncuDir := filepath.Join(dir, "ncu")
	shim := filepath.Join(dir, profiling.ShimName)
	for _, f := range []string{filepath.Join(ncuDir, "ncu"), shim} {
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return profiling.Options{StateDir: dir, NCUDir: ncuDir, ShimPath: shim}
}

func profileAPI(t *testing.T, funcs interceptor.Funcs) client.WithWatch {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).
		WithInterceptorFuncs(funcs).Build()
}

func unprepareOne(ctx context.Context, d *Driver, uid string) error {
	res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim-" + uid}, UID: types.UID(uid),
	}})
	if err == nil {
		err = res[types.UID(uid)]
	}
	return err
}

// waitForCollections waits until the report jobs are done; the deadline
// only keeps a regression from hanging the test run.
func waitForCollections(ctx context.Context, t *testing.T, d *Driver) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return d.state.profiler.jobs.pending() == 0, nil
	})
	if err != nil {
		t.Fatalf("%d report jobs still pending: %v", d.state.profiler.jobs.pending(), err)
	}
}

// TestCollectingAProfileDoesNotBlockOtherClaims: a profiled claim's report
// is read from a directory its tenant wrote and published through the API
// server. While that hangs, the claim's unprepare returns (the kubelet
// plugin helper holds a file lock across it during a rolling update), and
// other claims on the node prepare and unprepare.
func TestCollectingAProfileDoesNotBlockOtherClaims(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir := t.TempDir()
	// The first API call of the publisher hangs until released.
	publishing, release := make(chan struct{}), make(chan struct{})
	var blockOnce sync.Once
	api := profileAPI(t, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			blockOnce.Do(func() {
				close(publishing)
				<-release
			})
			return c.Get(ctx, key, obj, opts...)
		},
	})
	d := newTestDriver(t, "t4-2.yaml", dir)
	d.state.profiler.cfg = &ProfilingConfig{
		Options:   fakeProfilingHost(t, dir),
		Publisher: profiling.NewPublisher(profilingtest.WorkloadProfiles(api)),
		Retention: 5,
	}
	d.state.profiler.start(ctx)

	profiled := allocatedClaim("p1", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`))
	profiled.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: "train"}
	if r := prepare(t, d, profiled)["p1"]; r.Err != nil {
		t.Fatal(r.Err)
	}

	// The deadline only keeps a regression from hanging the test run.
	guard, stop := context.WithTimeout(ctx, time.Minute)
	defer stop()
	unprepared := make(chan error, 1)
	go func() { unprepared <- unprepareOne(ctx, d, "p1") }()
	select {
	case <-publishing:
	case <-guard.Done():
		t.Fatal("the profiled claim's report was never published")
	}
	select {
	case err := <-unprepared:
		if err != nil {
			t.Fatalf("unprepare: %v", err)
		}
	case <-guard.Done():
		t.Fatal("the profiled claim's unprepare waited for its report to be published")
	}

	if r := prepare(t, d, allocatedClaim("other", []string{"gpu-1"}))["other"]; r.Err != nil {
		t.Errorf("prepare of another claim: %v", r.Err)
	}
	if err := unprepareOne(ctx, d, "other"); err != nil {
		t.Errorf("unprepare of another claim: %v", err)
	}
	if got := testutil.ToFloat64(d.metrics.profileCollectionsPending); got != 1 {
		t.Errorf("prism_plugin_profile_collections_pending = %v while publishing, want 1", got)
	}
	close(release)
	waitForCollections(ctx, t, d)

	var wp prismv1alpha1.WorkloadProfile
	if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "train"}, &wp); err != nil {
		t.Fatalf("the profile was not published: %v", err)
	}
	archived, err := os.ReadDir(filepath.Join(dir, "profiles", "archive"))
	if err != nil || len(archived) != 1 {
		t.Errorf("archive holds %v (%v), want the claim's report directory", archived, err)
	}
	if _, err := os.Stat(profiling.ClaimDir(dir, "p1")); !os.IsNotExist(err) {
		t.Errorf("claim directory still there after unprepare: %v", err)
	}
	if got := testutil.ToFloat64(d.metrics.profileCollectionsPending); got != 0 {
		t.Errorf("prism_plugin_profile_collections_pending = %v after the job, want 0", got)
	}
}

// TestReportJobsOutliveThePlugin: a plugin stopped after a profiled claim's
// unprepare returned and before its report was published publishes it
// after its next start; a run that finished does not lose its profile.
// While the API server refuses, the job is retried, not dropped.
func TestReportJobsOutliveThePlugin(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	host := fakeProfilingHost(t, dir)
	refusals := 2
	api := profileAPI(t, interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if refusals > 0 {
				refusals--
				return apierrors.NewServiceUnavailable("the API server is restarting")
			}
			return c.Get(ctx, key, obj, opts...)
		},
	})
	configure := func(cfg *Config) {
		cfg.Profiling = &ProfilingConfig{Options: host, Publisher: profiling.NewPublisher(profilingtest.WorkloadProfiles(api)), Retention: 5}
	}

	// The first plugin prepares and unprepares, and stops before any job runs.
	first := newTestDriverWith(t, "t4-2.yaml", dir, configure)
	profiled := allocatedClaim("p1", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`))
	profiled.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: "train"}
	if r := prepare(t, first, profiled)["p1"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	if err := os.WriteFile(filepath.Join(profiling.ClaimDir(dir, "p1"), profiling.ReportFile), vectorAddReport(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := unprepareOne(ctx, first, "p1"); err != nil {
		t.Fatalf("unprepare: %v", err)
	}
	if got := first.state.profiler.jobs.pending(); got != 1 {
		t.Fatalf("%d report jobs queued by unprepare, want 1", got)
	}

	second := newTestDriverWith(t, "t4-2.yaml", dir, configure)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	second.state.profiler.start(ctx)
	waitForCollections(ctx, t, second)

	var wp prismv1alpha1.WorkloadProfile
	if err := api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "train"}, &wp); err != nil {
		t.Fatalf("the profile was not published after the restart: %v", err)
	}
	if wp.Status.BoundType != prismv1alpha1.BoundTypeMemoryBound {
		t.Errorf("bound type %q, want MemoryBound from the vector-add report", wp.Status.BoundType)
	}
	if src := wp.Status.Source; src == nil || src.ResourceClaim == nil || src.ResourceClaim.Name != "claim-p1" {
		t.Errorf("status.source %+v, want the claim", src)
	}
	if pending, err := profiling.PendingJobs(dir); err != nil || len(pending) != 0 {
		t.Errorf("pending jobs after the restart: %v (%v), want none", pending, err)
	}
	if got := testutil.ToFloat64(second.metrics.profilingRuns.WithLabelValues("ReportCollected")); got != 1 {
		t.Errorf("prism_plugin_profiling_runs_total{outcome=ReportCollected} = %v, want 1: retries count once", got)
	}
}

func vectorAddReport(t *testing.T) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "pkg", "ncu", "testdata", "vectoradd_raw.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestProfiledClaimWritesIntoABoundedDirectory: with a size set, the
// directory a profiled claim's containers get is a tmpfs of that size, and
// unprepare leaves no mount behind, only the archived report.
func TestProfiledClaimWritesIntoABoundedDirectory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	host := fakeProfilingHost(t, dir)
	const size = 1 << 20
	host.DirSize = size
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	d := newTestDriverWith(t, "t4-2.yaml", dir, func(cfg *Config) {
		cfg.Profiling = &ProfilingConfig{Options: host, Retention: 5}
	})
	reportDir := profiling.ClaimDir(dir, "p1")
	t.Cleanup(func() {
		// A failing test must not also fail to remove its directory.
		_ = unix.Unmount(reportDir, unix.MNT_DETACH)
	})

	if r := prepare(t, d, allocatedClaim("p1", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`)))["p1"]; r.Err != nil {
		t.Fatal(r.Err)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(reportDir, &fs); err != nil {
		t.Fatal(err)
	}
	if fs.Type != unix.TMPFS_MAGIC || uint64(fs.Blocks)*uint64(fs.Bsize) != size {
		t.Errorf("report directory on file system %#x of %d bytes, want a tmpfs of %d", fs.Type, uint64(fs.Blocks)*uint64(fs.Bsize), size)
	}

	d.state.profiler.start(ctx)
	if err := unprepareOne(ctx, d, "p1"); err != nil {
		t.Fatalf("unprepare: %v", err)
	}
	waitForCollections(ctx, t, d)
	mountinfo, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mountinfo), " "+dir+"/") {
		t.Errorf("a mount under the state directory outlived unprepare:\n%s", mountinfo)
	}
	if archived, err := os.ReadDir(filepath.Join(dir, "profiles", "archive")); err != nil || len(archived) != 1 {
		t.Errorf("archive holds %v (%v), want the claim's report directory", archived, err)
	}
	// The workload wrote no report, and the dashboard says so.
	if got := testutil.ToFloat64(d.metrics.profilingRuns.WithLabelValues(string(profiling.ReasonReportMissing))); got != 1 {
		t.Errorf("prism_plugin_profiling_runs_total{outcome=ReportMissing} = %v, want 1", got)
	}
}

func TestProfilingOutcome(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{nil, "ReportCollected"},
		{&profiling.CollectError{Reason: profiling.ReasonReportTooLarge}, "ReportTooLarge"},
		{fmt.Errorf("collect: %w", &profiling.CollectError{Reason: profiling.ReasonProfilerFailed}), "ProfilerFailed"},
		{errors.New("open report directory: permission denied"), "CollectFailed"},
	} {
		if got := profilingOutcome(tc.err); got != tc.want {
			t.Errorf("profilingOutcome(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}
