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
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

const h100Product = "NVIDIA H100 80GB HBM3"

// usageBed is a node whose simulated GPUs' usage the test writes, with a
// /proc of its own and a fake API for WorkloadProfiles.
type usageBed struct {
	dir, usageFile, procRoot string
	api                      client.WithWatch
}

func newUsageBed(t *testing.T) *usageBed {
	t.Helper()
	dir := t.TempDir()
	return &usageBed{dir: dir, usageFile: filepath.Join(dir, "usage.json"), procRoot: filepath.Join(dir, "proc"),
		api: profileAPI(t, interceptor.Funcs{})}
}

// driver starts a driver on the bed's state directory, as a restart would.
func (b *usageBed) driver(t *testing.T) *Driver {
	t.Helper()
	return newTestDriverWith(t, "h100-sxm-8.yaml", b.dir, func(c *Config) {
		c.Usage = &sampler.Config{NVML: simulatedNVML(t, "h100-sxm-8.yaml", b.usageFile), Profiles: profilingtest.WorkloadProfiles(b.api), ProcRoot: b.procRoot}
	})
}

func (b *usageBed) use(t testing.TB, gpus ...nvml.GPUUsage) {
	t.Helper()
	if err := nvml.WriteUsage(b.usageFile, nvml.Usage{GPUs: gpus}); err != nil {
		t.Fatal(err)
	}
}

// process puts a process of the pod with this UID (none: a host process)
// into the bed's /proc, with a cgroup as the kubelet's systemd driver
// names it.
func (b *usageBed) process(t testing.TB, pid string, pod types.UID) {
	t.Helper()
	cgroup := "0::/system.slice/nvidia-persistenced.service\n"
	if pod != "" {
		cgroup = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + replaceDashes(string(pod)) + ".slice/cri-containerd-0123.scope\n"
	}
	if err := os.MkdirAll(filepath.Join(b.procRoot, pid), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(b.procRoot, pid, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
}

func replaceDashes(s string) string {
	out := []byte(s)
	for i, c := range out {
		if c == '-' {
			out[i] = '_'
		}
	}
	return string(out)
}

func (b *usageBed) profile(t *testing.T, name string) *prismv1alpha1.UsageProfile {
	t.Helper()
	wp := &prismv1alpha1.WorkloadProfile{}
	if err := b.api.Get(context.Background(), client.ObjectKey{Namespace: "ns", Name: name}, wp); err != nil {
		t.Fatalf("WorkloadProfile ns/%s: %v", name, err)
	}
	if wp.Status.Usage != nil {
		// When the run ended is the test's clock's business.
		wp.Status.Usage.ObservedAt = nil
	}
	return wp.Status.Usage
}

// profiledClaim is claim-UID, annotated for a profile and reserved by
// pod-UID (whose pod UID is pod-uid-UID).
func profiledClaim(c *resourceapi.ResourceClaim, profile string) *resourceapi.ResourceClaim {
	c.Annotations = map[string]string{prismv1alpha1.ProfileAnnotation: profile}
	c.Status.ReservedFor = []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "pod-" + c.Name[len("claim-"):], UID: podUID(c.UID)}}
	return c
}

func podUID(claim types.UID) types.UID {
	hex := hexOf(string(claim))
	return types.UID(strings.Repeat("0", 8-len(hex)) + hex + "-1111-2222-3333-444455556666")
}

// hexOf spells a short claim UID in hex digits, as a pod UID has them.
func hexOf(s string) string {
	return fmt.Sprintf("%x", s)
}

func sample(t *testing.T, d *Driver, times int) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	for range times {
		d.state.usage.Sample(ctx)
	}
}

// sampledClaim starts a driver on the bed, prepares claim-a on gpu for
// profile and samples it the given number of times.
func (b *usageBed) sampledClaim(t *testing.T, gpu, profile string, times int) *Driver {
	t.Helper()
	d := b.driver(t)
	if res := prepare(t, d, profiledClaim(allocatedClaim("a", []string{gpu}), profile))["a"]; res.Err != nil {
		t.Fatal(res.Err)
	}
	sample(t, d, times)
	return d
}

// TestUsageIsSampledAndPublishedAtUnprepare: a claim alone on an H100 is
// sampled from the whole GPU's figures, exported per pod, and merged into
// its WorkloadProfile after unprepare.
func TestUsageIsSampledAndPublishedAtUnprepare(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	bed := newUsageBed(t)
	bed.use(t, nvml.GPUUsage{Index: 0, UtilizationPercent: 40, MemoryUsedBytes: 10 << 30, SMActivityPercent: 30, DRAMActivityPercent: 12})
	d := bed.sampledClaim(t, "gpu-0", "train", 3)

	gpu0 := uuidOf(t, d, "gpu-0")
	want := map[string][]string{
		"prism_plugin_gpu_duty_cycle_percent":    {"ns/pod-a claim-a " + gpu0 + " = 40"},
		"prism_plugin_gpu_memory_used_bytes":     {fmt.Sprintf("ns/pod-a claim-a %s = %d", gpu0, 10<<30)},
		"prism_plugin_gpu_sm_activity_percent":   {"ns/pod-a claim-a " + gpu0 + " = 30"},
		"prism_plugin_gpu_dram_activity_percent": {"ns/pod-a claim-a " + gpu0 + " = 12"},
	}
	if diff := cmp.Diff(want, podSeries(t, d)); diff != "" {
		t.Errorf("per-pod GPU series (-want +got):\n%s", diff)
	}
	if err := unprepareOne(ctx, d, "a"); err != nil {
		t.Fatal(err)
	}
	if got := podSeries(t, d); len(got) != 0 {
		t.Errorf("per-pod GPU series left after unprepare: %v", got)
	}
	d.state.usage.PublishNext(ctx)

	// GPM needs two samples for its first figure: three samples give two.
	// Busy: three samples at 40 % of a 5 s interval.
	wantUsage := &prismv1alpha1.UsageProfile{
		DutyCycleP50MilliPercent: ptr.To[int32](40000), DutyCycleP95MilliPercent: ptr.To[int32](40000),
		SMActivityMilliPercent: ptr.To[int32](30000), DRAMActivityMilliPercent: ptr.To[int32](12000),
		PeakMemory: resource.NewQuantity(10<<30, resource.BinarySI), Samples: 3, Runs: 1, ProductName: h100Product,
		Models: []prismv1alpha1.ModelUsage{{ProductName: h100Product, Runs: 1, BusyMilliseconds: 6000}},
	}
	if diff := cmp.Diff(wantUsage, bed.profile(t, "train")); diff != "" {
		t.Errorf("status.usage (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"Merged": 1}, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_usage_runs_total", "outcome")); diff != "" {
		t.Errorf("usage_runs_total by outcome (-want +got):\n%s", diff)
	}
	if _, err := os.Stat(filepath.Join(bed.dir, usageDir, "a.json")); !os.IsNotExist(err) {
		t.Errorf("usage record still on disk after publishing: %v", err)
	}
}

// TestUsageRunSurvivesARestart: the samples taken before the plugin
// stopped count in the run published after it started again, whether the
// claim is released after the restart or was released while the plugin
// was stopped: a claim that left the checkpoint after its record was last
// written (the plugin died between the two) is published from the record.
func TestUsageRunSurvivesARestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		// release releases claim-a, before or after the restart, and
		// returns the restarted driver.
		release           func(ctx context.Context, t *testing.T, bed *usageBed, stopped *Driver) *Driver
		samplesBeforeStop int
		want              *prismv1alpha1.UsageProfile
	}{
		{
			name: "released after the restart",
			release: func(ctx context.Context, t *testing.T, bed *usageBed, _ *Driver) *Driver {
				restarted := bed.driver(t)
				bed.use(t, nvml.GPUUsage{Index: 1, UtilizationPercent: 60, MemoryUsedBytes: 6 << 30})
				sample(t, restarted, 1)
				if err := unprepareOne(ctx, restarted, "a"); err != nil {
					t.Fatal(err)
				}
				return restarted
			},
			// Samples 20, 20, 60: the median is the second, p95 the third.
			// The H100's GPM showed an idle GPU (the file gives no GPM
			// figures). Busy: (0.2 + 0.2 + 0.6) of a 5 s interval.
			samplesBeforeStop: 2,
			want: &prismv1alpha1.UsageProfile{
				DutyCycleP50MilliPercent: ptr.To[int32](20000), DutyCycleP95MilliPercent: ptr.To[int32](60000),
				SMActivityMilliPercent: ptr.To[int32](0), DRAMActivityMilliPercent: ptr.To[int32](0),
				PeakMemory: resource.NewQuantity(6<<30, resource.BinarySI), Samples: 3, Runs: 1, ProductName: h100Product,
				Models: []prismv1alpha1.ModelUsage{{ProductName: h100Product, Runs: 1, BusyMilliseconds: 5000}},
			},
		},
		{
			name: "released while stopped",
			release: func(ctx context.Context, t *testing.T, bed *usageBed, stopped *Driver) *Driver {
				if err := stopped.state.forget(ctx, "a"); err != nil {
					t.Fatal(err)
				}
				return bed.driver(t)
			},
			samplesBeforeStop: 3,
			want: &prismv1alpha1.UsageProfile{
				DutyCycleP50MilliPercent: ptr.To[int32](20000), DutyCycleP95MilliPercent: ptr.To[int32](20000),
				SMActivityMilliPercent: ptr.To[int32](0), DRAMActivityMilliPercent: ptr.To[int32](0),
				PeakMemory: resource.NewQuantity(4<<30, resource.BinarySI), Samples: 3, Runs: 1, ProductName: h100Product,
				Models: []prismv1alpha1.ModelUsage{{ProductName: h100Product, Runs: 1, BusyMilliseconds: 3000}},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			bed := newUsageBed(t)
			bed.use(t, nvml.GPUUsage{Index: 1, UtilizationPercent: 20, MemoryUsedBytes: 4 << 30})
			d := bed.sampledClaim(t, "gpu-1", "train", tc.samplesBeforeStop)
			d.state.usage.Persist(ctx)
			tc.release(ctx, t, bed, d).state.usage.PublishNext(ctx)
			if diff := cmp.Diff(tc.want, bed.profile(t, "train")); diff != "" {
				t.Errorf("status.usage (-want +got):\n%s", diff)
			}
		})
	}
}

func TestShortRunIsNotMerged(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	bed := newUsageBed(t)
	d := bed.sampledClaim(t, "gpu-0", "train", 2)
	if err := unprepareOne(ctx, d, "a"); err != nil {
		t.Fatal(err)
	}
	d.state.usage.PublishNext(ctx)
	if diff := cmp.Diff(map[string]float64{"TooShort": 1}, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_usage_runs_total", "outcome")); diff != "" {
		t.Errorf("usage_runs_total by outcome (-want +got):\n%s", diff)
	}
	wp := &prismv1alpha1.WorkloadProfile{}
	if err := bed.api.Get(ctx, client.ObjectKey{Namespace: "ns", Name: "train"}, wp); err == nil {
		t.Errorf("a run of 2 samples created or wrote WorkloadProfile ns/train: %+v", wp.Status.Usage)
	}
}

// shareClaim is a profiled claim of a share of gpu-0: memory and compute.
func shareClaim(uid, memory string, compute int64) *resourceapi.ResourceClaim {
	c := profiledClaim(sharedClaim(uid, memory), "light")
	c.Status.Allocation.Devices.Results[0].ConsumedCapacity[gpuv1alpha1.ComputeCapacity.Qualified()] = *resource.NewQuantity(compute, resource.DecimalSI)
	return c
}

// TestSharedGPUCountsOnlyTheClaimsProcesses: on a shared GPU the claim's
// figures are its own pod's processes', never the neighbour's or the whole
// GPU's; a run past its share is recorded, counted and told to the pod.
func TestSharedGPUCountsOnlyTheClaimsProcesses(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	bed := newUsageBed(t)
	d := bed.driver(t)
	bed.process(t, "100", podUID("a"))
	bed.process(t, "101", podUID("a"))
	bed.process(t, "200", podUID("b"))
	bed.process(t, "300", "")
	bed.use(t, nvml.GPUUsage{Index: 0, UtilizationPercent: 95, MemoryUsedBytes: 40 << 30, Processes: []nvml.ProcessUsage{
		{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30},
		{PID: 101, UtilizationPercent: 18, MemoryUsedBytes: 3 << 30},
		{PID: 200, UtilizationPercent: 45, MemoryUsedBytes: 20 << 30},
		{PID: 300, MemoryUsedBytes: 1 << 30},
	}})
	// a's config caps its SMs at its compute; b's asks for no cap.
	a := shareClaim("a", "8Gi", 50)
	a.Status.Allocation.Devices.Config = append(a.Status.Allocation.Devices.Config,
		opaque(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig","sharing":{"computeLimitPercent":50}}`))
	if res := prepare(t, d, a, shareClaim("b", "30Gi", 50)); res["a"].Err != nil || res["b"].Err != nil {
		t.Fatalf("prepare: %v, %v", res["a"].Err, res["b"].Err)
	}
	sample(t, d, 3)
	gpu0 := uuidOf(t, d, "gpu-0")
	// No GPM series: GPM on a shared GPU counts the neighbours too.
	wantSeries := map[string][]string{
		"prism_plugin_gpu_duty_cycle_percent": {"ns/pod-a claim-a " + gpu0 + " = 48", "ns/pod-b claim-b " + gpu0 + " = 45"},
		"prism_plugin_gpu_memory_used_bytes":  {fmt.Sprintf("ns/pod-a claim-a %s = %d", gpu0, 9<<30), fmt.Sprintf("ns/pod-b claim-b %s = %d", gpu0, 20<<30)},
	}
	if diff := cmp.Diff(wantSeries, podSeries(t, d), inAnyOrder); diff != "" {
		t.Errorf("per-pod GPU series of two shares (-want +got):\n%s", diff)
	}

	if err := unprepareOne(ctx, d, "a"); err != nil {
		t.Fatal(err)
	}
	d.state.usage.PublishNext(ctx)
	// 9Gi held against a share of 8Gi; a p95 of 48 % is within 5 points of
	// the 50 % compute cap.
	want := &prismv1alpha1.UsageProfile{
		DutyCycleP50MilliPercent: ptr.To[int32](48000), DutyCycleP95MilliPercent: ptr.To[int32](48000),
		PeakMemory: resource.NewQuantity(9<<30, resource.BinarySI), Samples: 3, Runs: 1, ProductName: h100Product,
		Share: &prismv1alpha1.GrantedShare{ComputePercent: 50, Memory: resource.NewQuantity(8<<30, resource.BinarySI)},
		Exceeded: &prismv1alpha1.ShareExceeded{
			Resources: []prismv1alpha1.ShareResource{prismv1alpha1.ShareResourceMemory, prismv1alpha1.ShareResourceCompute},
			Message:   "peak memory 9Gi above its share of 8Gi; duty cycle p95 48% at its compute cap of 50%",
		},
	}
	if diff := cmp.Diff(want, bed.profile(t, "light")); diff != "" {
		t.Errorf("status.usage (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]float64{"memory": 1, "compute": 1}, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_share_exceeded_total", "resource")); diff != "" {
		t.Errorf("share_exceeded_total by resource (-want +got):\n%s", diff)
	}
	ev := waitForEvent(t, d.cfg.KubeClient, sampler.EventReasonShareExceeded)
	if ev.InvolvedObject.Kind != "Pod" && ev.InvolvedObject.Kind != "WorkloadProfile" {
		t.Errorf("ShareExceeded event on %s, want the pod or the WorkloadProfile", ev.InvolvedObject.Kind)
	}
}

// TestUnattributableProcessDropsTheSample: a process on a shared GPU whose
// pod cannot be read might be the claim's own; the claim's figures without
// it would be too low, so those it holds, here both, are left out
// (TestSharedGPUAttribution has the rule).
func TestUnattributableProcessDropsTheSample(t *testing.T) {
	bed := newUsageBed(t)
	d := bed.driver(t)
	bed.process(t, "100", podUID("a"))
	bed.use(t, nvml.GPUUsage{Index: 0, Processes: []nvml.ProcessUsage{
		{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30},
		{PID: 999, UtilizationPercent: 50, MemoryUsedBytes: 1 << 30}, // no /proc entry
	}})
	if res := prepare(t, d, shareClaim("a", "8Gi", 50))["a"]; res.Err != nil {
		t.Fatal(res.Err)
	}
	sample(t, d, 3)
	if got := d.state.usage.Samples()["a"]; got != 0 {
		t.Errorf("%d samples taken beside a process of unknown pod, want 0", got)
	}
}

// podSeries lists the per-pod GPU series the plugin exports now, by
// metric: "namespace/pod claim gpu = value".
func podSeries(t *testing.T, d *Driver) map[string][]string {
	t.Helper()
	families, err := d.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "prism_plugin_gpu_") || len(f.GetMetric()) == 0 {
			continue
		}
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[f.GetName()] = append(out[f.GetName()], fmt.Sprintf("%s/%s %s %s = %s", l["namespace"], l["pod"], l["claim"], l["gpu"], strconv.FormatFloat(m.GetGauge().GetValue(), 'f', -1, 64)))
		}
	}
	return out
}

var inAnyOrder = cmpopts.SortSlices(func(a, b string) bool { return a < b })

// TestPerPodSeriesGoWithTheClaim: the per-pod series are one per prepared
// claim and GPU, and go when the claim is released, by unprepare or by a
// path that bypasses it (the stale-claim sweep and start-up reconciliation
// drop the claim from the checkpoint, and the next cycle sees it gone); a
// neighbour's series stay.
func TestPerPodSeriesGoWithTheClaim(t *testing.T) {
	for _, tc := range []struct {
		name    string
		release func(context.Context, *Driver) error
	}{
		{"unprepare", func(ctx context.Context, d *Driver) error { return unprepareOne(ctx, d, "a") }},
		{"outside unprepare", func(ctx context.Context, d *Driver) error { return d.state.forget(ctx, "a") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			bed := newUsageBed(t)
			d := bed.driver(t)
			bed.use(t,
				nvml.GPUUsage{Index: 0, UtilizationPercent: 10, MemoryUsedBytes: 1 << 30, SMActivityPercent: 5, DRAMActivityPercent: 2},
				nvml.GPUUsage{Index: 1, UtilizationPercent: 20, MemoryUsedBytes: 2 << 30, SMActivityPercent: 15, DRAMActivityPercent: 4},
				nvml.GPUUsage{Index: 2, UtilizationPercent: 30, MemoryUsedBytes: 3 << 30, SMActivityPercent: 25, DRAMActivityPercent: 6})
			res := prepare(t, d, profiledClaim(allocatedClaim("a", []string{"gpu-0", "gpu-1"}), "train"), profiledClaim(allocatedClaim("b", []string{"gpu-2"}), "train"))
			if res["a"].Err != nil || res["b"].Err != nil {
				t.Fatalf("prepare: %v, %v", res["a"].Err, res["b"].Err)
			}
			sample(t, d, 2)
			gpu0, gpu1, gpu2 := uuidOf(t, d, "gpu-0"), uuidOf(t, d, "gpu-1"), uuidOf(t, d, "gpu-2")
			want := map[string][]string{
				"prism_plugin_gpu_duty_cycle_percent": {"ns/pod-a claim-a " + gpu0 + " = 10", "ns/pod-a claim-a " + gpu1 + " = 20", "ns/pod-b claim-b " + gpu2 + " = 30"},
				"prism_plugin_gpu_memory_used_bytes": {
					fmt.Sprintf("ns/pod-a claim-a %s = %d", gpu0, 1<<30), fmt.Sprintf("ns/pod-a claim-a %s = %d", gpu1, 2<<30), fmt.Sprintf("ns/pod-b claim-b %s = %d", gpu2, 3<<30),
				},
				"prism_plugin_gpu_sm_activity_percent":   {"ns/pod-a claim-a " + gpu0 + " = 5", "ns/pod-a claim-a " + gpu1 + " = 15", "ns/pod-b claim-b " + gpu2 + " = 25"},
				"prism_plugin_gpu_dram_activity_percent": {"ns/pod-a claim-a " + gpu0 + " = 2", "ns/pod-a claim-a " + gpu1 + " = 4", "ns/pod-b claim-b " + gpu2 + " = 6"},
			}
			if diff := cmp.Diff(want, podSeries(t, d), inAnyOrder); diff != "" {
				t.Fatalf("per-pod GPU series of two claims (-want +got):\n%s", diff)
			}

			if err := tc.release(ctx, d); err != nil {
				t.Fatal(err)
			}
			sample(t, d, 1)
			for name, series := range want {
				want[name] = slices.DeleteFunc(series, func(s string) bool { return strings.Contains(s, " claim-a ") })
			}
			if diff := cmp.Diff(want, podSeries(t, d), inAnyOrder); diff != "" {
				t.Errorf("per-pod GPU series after claim-a was released (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProfiledClaimsRunIsMarked: the sampler hears that a claim runs under
// Nsight Compute, whose kernel replays make its busy time say nothing of
// the GPU model.
func TestProfiledClaimsRunIsMarked(t *testing.T) {
	d := newUsageBed(t).driver(t)
	for _, profiling := range []*checkpoint.Profiling{nil, {Profile: "train"}} {
		c := d.state.usageClaim(checkpoint.Claim{UID: "a", Namespace: "ns", Name: "claim-a", Profiling: profiling, Devices: []checkpoint.Device{{Name: "gpu-0"}}})
		if c.Profiled != (profiling != nil) || c.ProductName != h100Product {
			t.Errorf("claim with profiling %+v: profiled %v on %q, want %v on %q", profiling, c.Profiled, c.ProductName, profiling != nil, h100Product)
		}
	}
}
