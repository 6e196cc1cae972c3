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
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// maxLogLine bounds every log line the plugin writes about a claim whose
// profile annotation is invalid: the error quotes 64 bytes of the value.
const maxLogLine = 2 << 10

// TestInvalidProfileAnnotationStaysBounded: a claim's prism.dev/profile of
// 200 KiB names no WorkloadProfile. Its run is neither merged nor
// published, no API request carries the value, and no log line holds more
// than the error's bounded quote of it. The value once reached a log line
// at v0 for a run too short, each try of a failed publish (about 800 KB,
// ten tries), the checkpoint and the report job.
func TestInvalidProfileAnnotationStaysBounded(t *testing.T) {
	huge := strings.Repeat("p", 200<<10)
	for _, tc := range []struct {
		name    string
		samples int
		// refuse makes the API refuse every request, as while it is down.
		refuse   bool
		profiled bool
	}{
		{name: "a run too short to merge", samples: 2},
		{name: "a run the API refuses", samples: 3, refuse: true},
		{name: "a profiled run", samples: 3, profiled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx, cancel := context.WithCancel(klog.NewContext(t.Context(), logger))
			defer cancel()
			var requests atomic.Int32
			count := func() error {
				requests.Add(1)
				if tc.refuse {
					return apierrors.NewServiceUnavailable("the API server is restarting")
				}
				return nil
			}
			bed := newUsageBed(t)
			bed.api = profileAPI(t, interceptor.Funcs{
				Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
					if err := count(); err != nil {
						return err
					}
					return c.Get(ctx, key, obj, opts...)
				},
				Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
					if err := count(); err != nil {
						return err
					}
					return c.Create(ctx, obj, opts...)
				},
				SubResourceUpdate: func(ctx context.Context, c client.Client, sub string, obj client.Object, opts ...client.SubResourceUpdateOption) error {
					if err := count(); err != nil {
						return err
					}
					return c.SubResource(sub).Update(ctx, obj, opts...)
				},
			})
			bed.use(t, nvml.GPUUsage{Index: 0, UtilizationPercent: 40, MemoryUsedBytes: 10 << 30})
			d := bed.driver(t)
			claim := profiledClaim(allocatedClaim("a", []string{"gpu-0"}), huge)
			if tc.profiled {
				d.state.profiler.cfg = &ProfilingConfig{
					Options:   fakeProfilingHost(t, bed.dir),
					Publisher: profiling.NewPublisher(profilingtest.WorkloadProfiles(bed.api)),
					Retention: 5,
				}
				claim = profiledClaim(allocatedClaim("a", []string{"gpu-0"}, opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","profiling":{"enabled":true}}`)), huge)
			}

			res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{claim})
			if err == nil {
				err = res["a"].Err
			}
			if err != nil {
				t.Fatal(err)
			}
			if rec, _ := d.state.checkpoint.Get("a"); rec.Profiling != nil && rec.Profiling.Profile != "" {
				t.Errorf("checkpoint keeps a profile of %d bytes, want none", len(rec.Profiling.Profile))
			}
			if tc.profiled {
				if err := os.WriteFile(filepath.Join(profiling.ClaimDir(bed.dir, "a"), profiling.ReportFile), vectorAddReport(t), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			sample(t, d, tc.samples)
			if err := unprepareOne(ctx, d, "a"); err != nil {
				t.Fatal(err)
			}
			d.state.usage.PublishNext(ctx)
			if tc.profiled {
				d.state.profiler.start(ctx)
				waitForCollections(ctx, t, d)
			}

			if diff := cmp.Diff(map[string]float64{"NoProfile": 1}, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_usage_runs_total", "outcome")); diff != "" {
				t.Errorf("usage_runs_total by outcome (-want +got):\n%s", diff)
			}
			if n := requests.Load(); n != 0 {
				t.Errorf("%d WorkloadProfile requests, want none for a claim that names no valid profile", n)
			}
			longest := 0
			for line := range strings.Lines(logger.GetSink().(ktesting.Underlier).GetBuffer().String()) {
				longest = max(longest, len(line))
			}
			switch {
			case longest == 0:
				t.Error("nothing was logged: the check of the log lines is broken")
			case longest > maxLogLine:
				t.Errorf("longest log line has %d bytes, want at most %d", longest, maxLogLine)
			}
		})
	}
}
