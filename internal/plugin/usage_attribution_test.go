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
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prismgpu/prism/internal/metricstest"
	"github.com/prismgpu/prism/internal/plugin/profiling/profilingtest"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// pluginPod is the UID of the plugin's own pod, whose container runs the MPS
// control daemons and so their servers.
const pluginPod types.UID = "ffffffff-1111-2222-3333-444455556666"

// claimFigures is what the sampler recorded of a claim on one GPU: its
// last sample's duty cycle and memory ("-" where the sample lacked the
// figure, so its series is gone), and how many duty-cycle samples its run
// holds over all its GPUs.
type claimFigures struct {
	Duty, Memory string
	Samples      int32
}

// TestSharedGPUAttribution: on a shared GPU each claim's figures are its
// own processes', and a process whose claim cannot be told costs only the
// figures it could hide, of the claims it could belong to. Claims a and b
// share gpu-0 (through its MPS daemon where mps is set); claim c shares
// gpu-0 and gpu-1, which MPS cannot enforce (a container reaches one
// daemon), so it runs time-sliced beside them and is never the MPS
// server's client.
func TestSharedGPUAttribution(t *testing.T) {
	mpsRoot := newMPSDriver(t).driverRoot
	for _, tc := range []struct {
		name string
		mps  bool
		// claims are prepared on gpu-0; a, b and c where none are named.
		claims []string
		// owners are the processes with a /proc entry: a claim's pod ("a",
		// "b", "c"), "host", or "server" (the plugin's MPS server). A
		// process without one cannot be read.
		owners map[uint32]string
		// before is sampled once; then the processes in gone leave /proc
		// (they exited), and now is sampled three times.
		before []nvml.ProcessUsage
		gone   []uint32
		now    []nvml.ProcessUsage
		want   map[string]claimFigures
		// wantUnattributed is prism_plugin_usage_unattributed_total by
		// reason: claims' samples with a figure left out.
		wantUnattributed map[string]float64
	}{
		{
			// The neighbour's process exited, but NVML still lists it: it
			// was b's when it was read, and it is still b's, not a
			// stranger that might be a's.
			name:   "a neighbour's exited process stays its own",
			owners: map[uint32]string{100: "a", 200: "b"},
			before: []nvml.ProcessUsage{{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}},
			gone:   []uint32{200},
			now:    []nvml.ProcessUsage{{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}},
			want: map[string]claimFigures{
				"claim-a": {"30", "6Gi", 4}, "claim-b": {"40", "4Gi", 4},
				// c's gpu-1 gives a sample every cycle too.
				"claim-c": {"0", "0", 8},
			},
		},
		{
			// Seen only once it had exited: any claim's, or no claim's.
			// Its utilisation may be anyone's, but it holds no memory.
			name:   "an unreadable process with utilisation",
			owners: map[uint32]string{100: "a", 200: "b"},
			now:    []nvml.ProcessUsage{{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}, {PID: 999, UtilizationPercent: 20}},
			want: map[string]claimFigures{
				"claim-a": {"-", "6Gi", 0}, "claim-b": {"-", "4Gi", 0}, "claim-c": {"-", "0", 3},
			},
			wantUnattributed: map[string]float64{"unreadable": 9},
		},
		{
			name:   "an unreadable process with memory",
			owners: map[uint32]string{100: "a", 200: "b"},
			now:    []nvml.ProcessUsage{{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}, {PID: 999, MemoryUsedBytes: 1 << 30}},
			want: map[string]claimFigures{
				"claim-a": {"30", "-", 3}, "claim-b": {"40", "-", 3}, "claim-c": {"0", "-", 6},
			},
			wantUnattributed: map[string]float64{"unreadable": 9},
		},
		{
			// An exited process's last, idle sample hides nothing.
			name:   "an unreadable process with neither",
			owners: map[uint32]string{100: "a", 200: "b"},
			now:    []nvml.ProcessUsage{{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}, {PID: 999}},
			want: map[string]claimFigures{
				"claim-a": {"30", "6Gi", 3}, "claim-b": {"40", "4Gi", 3}, "claim-c": {"0", "0", 6},
			},
		},
		{
			// The server idles in its own context; its clients' figures
			// are under their own PIDs.
			name:   "MPS clients under their own PIDs",
			mps:    true,
			owners: map[uint32]string{50: "server", 100: "a", 200: "b", 300: "c"},
			now: []nvml.ProcessUsage{
				{PID: 50, MemoryUsedBytes: 32 << 20},
				{PID: 100, UtilizationPercent: 30, MemoryUsedBytes: 6 << 30}, {PID: 200, UtilizationPercent: 40, MemoryUsedBytes: 4 << 30}, {PID: 300, UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
			},
			want: map[string]claimFigures{
				"claim-a": {"30", "6Gi", 3}, "claim-b": {"40", "4Gi", 3}, "claim-c": {"10", "2Gi", 6},
			},
		},
		{
			// The clients' kernels are the server's: how they split
			// between a and b is unknown. Their memory is their own, and
			// c never was the server's client.
			name:   "MPS clients' utilisation under the server's PID",
			mps:    true,
			owners: map[uint32]string{50: "server", 100: "a", 200: "b", 300: "c"},
			now: []nvml.ProcessUsage{
				{PID: 50, UtilizationPercent: 70, MemoryUsedBytes: 32 << 20},
				{PID: 100, MemoryUsedBytes: 6 << 30}, {PID: 200, MemoryUsedBytes: 4 << 30}, {PID: 300, UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
			},
			want: map[string]claimFigures{
				"claim-a": {"-", "6Gi", 0}, "claim-b": {"-", "4Gi", 0}, "claim-c": {"10", "2Gi", 6},
			},
			wantUnattributed: map[string]float64{"mps-server": 6},
		},
		{
			name:   "MPS clients wholly under the server's PID",
			mps:    true,
			owners: map[uint32]string{50: "server", 300: "c"},
			now: []nvml.ProcessUsage{
				{PID: 50, UtilizationPercent: 70, MemoryUsedBytes: 10 << 30},
				{PID: 300, UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
			},
			want: map[string]claimFigures{
				"claim-a": {"-", "-", 0}, "claim-b": {"-", "-", 0}, "claim-c": {"10", "2Gi", 6},
			},
			wantUnattributed: map[string]float64{"mps-server": 6},
		},
		{
			// With one client, the server's kernels are its.
			name:   "one MPS share's utilisation under the server's PID",
			mps:    true,
			claims: []string{"a", "c"},
			owners: map[uint32]string{50: "server", 100: "a", 300: "c"},
			now: []nvml.ProcessUsage{
				{PID: 50, UtilizationPercent: 70, MemoryUsedBytes: 32 << 20},
				{PID: 100, MemoryUsedBytes: 6 << 30}, {PID: 300, UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
			},
			want: map[string]claimFigures{
				"claim-a": {"70", "6Gi", 3}, "claim-c": {"10", "2Gi", 6},
			},
		},
		{
			name:   "one MPS share wholly under the server's PID",
			mps:    true,
			claims: []string{"a", "c"},
			owners: map[uint32]string{50: "server", 300: "c"},
			now: []nvml.ProcessUsage{
				{PID: 50, UtilizationPercent: 70, MemoryUsedBytes: 6 << 30},
				{PID: 300, UtilizationPercent: 10, MemoryUsedBytes: 2 << 30},
			},
			want: map[string]claimFigures{
				"claim-a": {"70", "6Gi", 3}, "claim-c": {"10", "2Gi", 6},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bed := newUsageBed(t)
			d := newTestDriverWith(t, "h100-sxm-8.yaml", bed.dir, func(c *Config) {
				c.Usage = &sampler.Config{NVML: simulatedNVML(t, "h100-sxm-8.yaml", bed.usageFile), Profiles: profilingtest.WorkloadProfiles(bed.api), ProcRoot: bed.procRoot}
				if tc.mps {
					c.MPSDriverRoot = mpsRoot
				}
			})
			for pid, owner := range tc.owners {
				switch owner {
				case "host":
					bed.process(t, itoa(pid), "")
				case "server":
					bed.mpsServer(t, itoa(pid))
				default:
					bed.process(t, itoa(pid), podUID(types.UID(owner)))
				}
			}
			claims := tc.claims
			if claims == nil {
				claims = []string{"a", "b", "c"}
			}
			for _, uid := range claims {
				c := shareClaim(uid, "8Gi", 30)
				if uid == "c" {
					c = twoGPUShare(c)
				}
				if res := prepare(t, d, c)[c.UID]; res.Err != nil {
					t.Fatal(res.Err)
				}
			}
			if tc.before != nil {
				bed.use(t, nvml.GPUUsage{Index: 0, Processes: tc.before})
				sample(t, d, 1)
			}
			for _, pid := range tc.gone {
				if err := os.RemoveAll(filepath.Join(bed.procRoot, itoa(pid))); err != nil {
					t.Fatal(err)
				}
			}
			bed.use(t, nvml.GPUUsage{Index: 0, Processes: tc.now})
			sample(t, d, 3)

			if diff := cmp.Diff(tc.want, figuresOn(t, d, uuidOf(t, d, "gpu-0"))); diff != "" {
				t.Errorf("claims' figures on gpu-0 (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantUnattributed, metricstest.Counters(t, d.metrics.Registry, "prism_plugin_usage_unattributed_total", "reason")); diff != "" {
				t.Errorf("prism_plugin_usage_unattributed_total (-want +got):\n%s", diff)
			}
		})
	}
}

// mpsServer puts an MPS server into the bed's /proc: a process of the
// plugin's pod that runs nvidia-cuda-mps-server.
func (b *usageBed) mpsServer(t testing.TB, pid string) {
	t.Helper()
	b.process(t, pid, pluginPod)
	if err := os.WriteFile(filepath.Join(b.procRoot, pid, "cmdline"), []byte("nvidia-cuda-mps-server\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// twoGPUShare adds a share of gpu-1 to a claim of a share of gpu-0.
func twoGPUShare(c *resourceapi.ResourceClaim) *resourceapi.ResourceClaim {
	second := c.Status.Allocation.Devices.Results[0]
	second.Device = "gpu-1"
	share := types.UID("share-" + string(c.UID) + "-1")
	second.ShareID = &share
	second.ConsumedCapacity = maps.Clone(second.ConsumedCapacity)
	c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, second)
	return c
}

// figuresOn reads every tracked claim's figures on gpu, by claim name.
func figuresOn(t *testing.T, d *Driver, gpu string) map[string]claimFigures {
	t.Helper()
	families, err := d.metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// last is the value of each claim's series on gpu, by metric.
	last := map[string]map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["gpu"] != gpu {
				continue
			}
			if last[f.GetName()] == nil {
				last[f.GetName()] = map[string]float64{}
			}
			last[f.GetName()][l["claim"]] = m.GetGauge().GetValue()
		}
	}
	figure := func(metric, claim string, format func(float64) string) string {
		v, ok := last[metric][claim]
		if !ok {
			return "-"
		}
		return format(v)
	}
	out := map[string]claimFigures{}
	for uid, samples := range d.state.usage.Samples() {
		name := "claim-" + uid
		out[name] = claimFigures{
			Duty:    figure("prism_plugin_gpu_duty_cycle_percent", name, func(v float64) string { return itoa(uint32(v)) }),
			Memory:  figure("prism_plugin_gpu_memory_used_bytes", name, func(v float64) string { return resource.NewQuantity(int64(v), resource.BinarySI).String() }),
			Samples: samples,
		}
	}
	return out
}

func itoa(n uint32) string { return strconv.FormatUint(uint64(n), 10) }
