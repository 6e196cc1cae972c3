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

package nvml

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
)

// figures is what the usage calls of one simulated GPU return.
type figures struct {
	Utilization            uint32
	MemoryUsed, MemoryFree uint64
	Processes              []nvml.ProcessInfo
	ProcessUtil            map[uint32]uint32
	ProcessUtilRet         nvml.Return
	GPM                    bool
	SMActivity, DRAM       float64
}

func readFigures(t *testing.T, s *Simulated, index int) figures {
	t.Helper()
	d, ret := s.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByIndex(%d): %v", index, ret)
	}
	var f figures
	util, ret := d.GetUtilizationRates()
	mustSucceed(t, "GetUtilizationRates", ret)
	mem, ret := d.GetMemoryInfo()
	mustSucceed(t, "GetMemoryInfo", ret)
	f.Utilization, f.MemoryUsed, f.MemoryFree = util.Gpu, mem.Used, mem.Free
	f.Processes, ret = d.GetComputeRunningProcesses()
	mustSucceed(t, "GetComputeRunningProcesses", ret)
	samples, ret := d.GetProcessUtilization(0)
	f.ProcessUtilRet = ret
	for _, s := range samples {
		if f.ProcessUtil == nil {
			f.ProcessUtil = map[uint32]uint32{}
		}
		f.ProcessUtil[s.Pid] = s.SmUtil
	}
	support, ret := d.GpmQueryDeviceSupport()
	mustSucceed(t, "GpmQueryDeviceSupport", ret)
	f.GPM = support.IsSupportedDevice == 1
	if f.GPM {
		s1, _ := s.GpmSampleAlloc()
		s2, _ := s.GpmSampleAlloc()
		mustSucceed(t, "GpmSampleGet", d.GpmSampleGet(s1))
		mustSucceed(t, "GpmSampleGet", d.GpmSampleGet(s2))
		m := &nvml.GpmMetricsGetType{NumMetrics: 2, Sample1: s1, Sample2: s2}
		m.Metrics[0].MetricId = uint32(nvml.GPM_METRIC_SM_UTIL)
		m.Metrics[1].MetricId = uint32(nvml.GPM_METRIC_DRAM_BW_UTIL)
		mustSucceed(t, "GpmMetricsGet", s.GpmMetricsGet(m))
		f.SMActivity, f.DRAM = m.Metrics[0].Value, m.Metrics[1].Value
	}
	return f
}

func mustSucceed(t *testing.T, call string, ret nvml.Return) {
	t.Helper()
	if ret != nvml.SUCCESS {
		t.Fatalf("%s: %v", call, ret)
	}
}

// TestUsageFileDrivesTheFigures: a test writes what each GPU and process
// uses, and every NVML call reads it afresh; without a file, or for a GPU
// it does not list, the GPU is idle. Only Hopper and later have GPM.
func TestUsageFileDrivesTheFigures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "usage.json")
	fleet := loadFleet(t, filepath.Join("..", "..", "..", "demo", "fleets", "mixed.yaml"))
	fleet.UsageFile = path
	s := simulate(t, fleet, "node-a")
	// An H100 reports what NVML reports on a real one; an L4's memory is
	// its marketing size, unmeasured.
	const h100, l4 = 81559 << 20, 24 << 30
	// Before the file exists.
	idle := figures{MemoryFree: h100, ProcessUtilRet: nvml.ERROR_NOT_FOUND, GPM: true}
	if diff := cmp.Diff(idle, readFigures(t, s, 0)); diff != "" {
		t.Errorf("GPU 0 without a usage file (-want +got):\n%s", diff)
	}

	err := WriteUsage(path, Usage{GPUs: []GPUUsage{
		{Index: 0, UtilizationPercent: 70, MemoryUsedBytes: 30 << 30, SMActivityPercent: 55.5, DRAMActivityPercent: 20,
			Processes: []ProcessUsage{{PID: 100, UtilizationPercent: 50, MemoryUsedBytes: 20 << 30}, {PID: 200, UtilizationPercent: 20, MemoryUsedBytes: 10 << 30}}},
		{Index: 4, UtilizationPercent: 130, MemoryUsedBytes: 1 << 40, SMActivityPercent: 90},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		index int
		want  figures
	}{
		{"H100 with two processes", 0, figures{
			Utilization: 70, MemoryUsed: 30 << 30, MemoryFree: h100 - 30<<30,
			Processes:   []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 20 << 30}, {Pid: 200, UsedGpuMemory: 10 << 30}},
			ProcessUtil: map[uint32]uint32{100: 50, 200: 20}, ProcessUtilRet: nvml.SUCCESS,
			GPM: true, SMActivity: 55.5, DRAM: 20,
		}},
		{"H100 not in the file", 1, figures{MemoryFree: h100, ProcessUtilRet: nvml.ERROR_NOT_FOUND, GPM: true}},
		// Clamped to what a GPU can report; an L4 (Ada) has no GPM.
		{"L4 past its limits", 4, figures{Utilization: 100, MemoryUsed: l4, ProcessUtilRet: nvml.ERROR_NOT_FOUND}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, readFigures(t, s, tc.index)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}

	// A file that does not decode is an NVML error, not made-up figures.
	if err := os.WriteFile(path, []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, _ := s.DeviceGetHandleByIndex(0)
	if _, ret := d.GetUtilizationRates(); ret != nvml.ERROR_UNKNOWN {
		t.Errorf("GetUtilizationRates with a broken usage file = %v, want ERROR_UNKNOWN", ret)
	}
}

func TestFleetNamesItsUsageFile(t *testing.T) {
	f, err := ParseFleet([]byte("driverVersion: \"550.54.15\"\ncudaDriverVersion: 12040\nusageFile: /run/usage.json\ngpus:\n- product: Tesla T4\n  count: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f.UsageFile != "/run/usage.json" {
		t.Errorf("usageFile = %q, want /run/usage.json", f.UsageFile)
	}
}
