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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profiling"
	"github.com/prismgpu/prism/pkg/profiling/profilingtest"
)

// TestCollectingAProfileDoesNotBlockOtherClaims: a profiled claim's report
// is read from a directory its tenant wrote and published through the API
// server; while that hangs, other claims on the node still prepare.
func TestCollectingAProfileDoesNotBlockOtherClaims(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
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
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	// The first API call of the publisher hangs until released.
	publishing, release := make(chan struct{}), make(chan struct{})
	var blockOnce sync.Once
	api := fake.NewClientBuilder().WithScheme(scheme).WithStatusSubresource(&prismv1alpha1.WorkloadProfile{}).
		WithInterceptorFuncs(interceptor.Funcs{
			Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
				blockOnce.Do(func() {
					close(publishing)
					<-release
				})
				return c.Get(ctx, key, obj, opts...)
			},
		}).Build()
	d := newTestDriver(t, "t4-2.yaml", dir)
	d.cfg.Profiling = &ProfilingConfig{
		Options:   profiling.Options{StateDir: dir, NCUDir: ncuDir, ShimPath: shim},
		Publisher: profiling.NewPublisher(profilingtest.WorkloadProfiles(api)),
		Retention: 5,
	}

	profiled := allocatedClaim("p1", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`))
	profiled.Annotations = map[string]string{profiling.ProfileAnnotation: "train"}
	if r := prepare(t, d, profiled)["p1"]; r.Err != nil {
		t.Fatal(r.Err)
	}

	unprepared := make(chan error, 1)
	go func() {
		res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{
			NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim-p1"}, UID: "p1",
		}})
		if err == nil {
			err = res["p1"]
		}
		unprepared <- err
	}()
	// The deadline only keeps a regression from hanging the test run.
	guard, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	select {
	case <-publishing:
	case <-guard.Done():
		t.Fatal("the profiled claim's unprepare never published its profile")
	}

	prepared := make(chan kubeletplugin.PrepareResult, 1)
	go func() {
		prepared <- prepare(t, d, allocatedClaim("other", []string{"gpu-1"}))["other"]
	}()
	select {
	case r := <-prepared:
		if r.Err != nil {
			t.Errorf("prepare of another claim: %v", r.Err)
		}
	case <-guard.Done():
		t.Error("prepare of another claim waited for the profiled claim's report to be collected")
	}
	close(release)
	if err := <-unprepared; err != nil {
		t.Fatalf("unprepare: %v", err)
	}

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
	const size = 1 << 20
	d := newTestDriverWith(t, "t4-2.yaml", dir, func(cfg *Config) {
		cfg.Profiling = &ProfilingConfig{Options: profiling.Options{StateDir: dir, NCUDir: ncuDir, ShimPath: shim, DirSize: size}, Retention: 5}
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

	res, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{
		NamespacedName: types.NamespacedName{Namespace: "ns", Name: "claim-p1"}, UID: "p1",
	}})
	if err == nil {
		err = res["p1"]
	}
	if err != nil {
		t.Fatalf("unprepare: %v", err)
	}
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
