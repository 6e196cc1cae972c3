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
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/prismgpu/prism/internal/atomicfile"
)

// Usage is what the simulated GPUs show workloads using, read from a fleet's
// usageFile on every NVML call, so that a test in another process drives
// the figures by rewriting the file while the plugin runs. A GPU the file
// does not list, and every GPU while there is no file, is idle. For example:
//
//	{"gpus": [{"index": 0, "utilizationPercent": 40, "memoryUsedBytes": 2147483648,
//	           "smActivityPercent": 35, "dramActivityPercent": 20,
//	           "processes": [{"pid": 4242, "utilizationPercent": 40, "memoryUsedBytes": 2147483648}]}]}
type Usage struct {
	GPUs []GPUUsage `json:"gpus"`
}

// GPUUsage is one simulated GPU's figures.
type GPUUsage struct {
	// Index is the GPU's NVML index.
	Index int `json:"index"`
	// UtilizationPercent and MemoryUsedBytes are the whole GPU's, as
	// nvmlDeviceGetUtilizationRates and nvmlDeviceGetMemoryInfo report them.
	UtilizationPercent uint32 `json:"utilizationPercent,omitempty"`
	MemoryUsedBytes    uint64 `json:"memoryUsedBytes,omitempty"`
	// SMActivityPercent and DRAMActivityPercent are GPM's figures, served
	// on GPUs of compute capability 9.0 and later, which have GPM.
	SMActivityPercent   float64 `json:"smActivityPercent,omitempty"`
	DRAMActivityPercent float64 `json:"dramActivityPercent,omitempty"`
	// Processes are the compute processes on the GPU, with the per-process
	// figures of nvmlDeviceGetComputeRunningProcesses and
	// nvmlDeviceGetProcessUtilization.
	Processes []ProcessUsage `json:"processes,omitempty"`
}

// ProcessUsage is one process's figures on a simulated GPU.
type ProcessUsage struct {
	PID                uint32 `json:"pid"`
	UtilizationPercent uint32 `json:"utilizationPercent,omitempty"`
	MemoryUsedBytes    uint64 `json:"memoryUsedBytes,omitempty"`
}

// WriteUsage replaces the usage file at path atomically, so that a reader
// never sees half of it.
func WriteUsage(path string, u Usage) error {
	data, err := json.Marshal(u)
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("write usage file: %w", err)
	}
	return nil
}

// readUsage returns the figures of the GPU with this index; a missing
// file is an idle node. A file that does not decode is NVML's unknown
// error, which a caller logs, rather than figures made up.
func readUsage(path string, index int) (GPUUsage, nvml.Return) {
	idle := GPUUsage{Index: index}
	if path == "" {
		return idle, nvml.SUCCESS
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return idle, nvml.SUCCESS
	}
	if err != nil {
		return idle, nvml.ERROR_UNKNOWN
	}
	var u Usage
	if err := json.Unmarshal(data, &u); err != nil {
		return idle, nvml.ERROR_UNKNOWN
	}
	for _, g := range u.GPUs {
		if g.Index == index {
			return g, nvml.SUCCESS
		}
	}
	return idle, nvml.SUCCESS
}

// gpmSample is a simulated GPM sample: the GPU it was taken on.
type gpmSample struct{ index int }

func (s *gpmSample) Free() nvml.Return { return nvml.SUCCESS }

func (s *gpmSample) Get(d nvml.Device) nvml.Return {
	i, ret := d.GetIndex()
	if ret != nvml.SUCCESS {
		return ret
	}
	s.index = i
	return nvml.SUCCESS
}

func (s *gpmSample) MigGet(nvml.Device, int) nvml.Return { return nvml.ERROR_NOT_SUPPORTED }

// simulateUsage wires the usage calls of the simulated GPUs and of NVML's
// GPM to the usage file (none when path is empty).
func (s *Simulated) simulateUsage(path string, gpus []*simulatedGPU) {
	for i, sg := range gpus {
		d := s.devices[i]
		total := sg.spec.MemoryBytes()
		gpm := sg.spec.ComputeCapability.Major >= 9
		d.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			u, ret := readUsage(path, sg.index)
			return nvml.Utilization{Gpu: min(u.UtilizationPercent, 100)}, ret
		}
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			u, ret := readUsage(path, sg.index)
			used := min(u.MemoryUsedBytes, total)
			return nvml.Memory{Total: total, Used: used, Free: total - used}, ret
		}
		d.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			u, ret := readUsage(path, sg.index)
			var out []nvml.ProcessInfo
			for _, p := range u.Processes {
				out = append(out, nvml.ProcessInfo{Pid: p.PID, UsedGpuMemory: p.MemoryUsedBytes})
			}
			return out, ret
		}
		d.GetProcessUtilizationFunc = func(lastSeen uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
			u, ret := readUsage(path, sg.index)
			if ret != nvml.SUCCESS {
				return nil, ret
			}
			now := uint64(time.Now().UnixMicro())
			var out []nvml.ProcessUtilizationSample
			for _, p := range u.Processes {
				out = append(out, nvml.ProcessUtilizationSample{Pid: p.PID, TimeStamp: now, SmUtil: min(p.UtilizationPercent, 100)})
			}
			// NVML's answer when no process ran since lastSeen.
			if len(out) == 0 {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return out, nvml.SUCCESS
		}
		d.GpmQueryDeviceSupportFunc = func() (nvml.GpmSupport, nvml.Return) {
			return nvml.GpmSupport{Version: nvml.GPM_SUPPORT_VERSION, IsSupportedDevice: boolToUint32(gpm)}, nvml.SUCCESS
		}
		d.GpmSampleGetFunc = func(sample nvml.GpmSample) nvml.Return {
			if !gpm {
				return nvml.ERROR_NOT_SUPPORTED
			}
			return sample.Get(d)
		}
	}
	s.GpmSampleAllocFunc = func() (nvml.GpmSample, nvml.Return) { return &gpmSample{index: -1}, nvml.SUCCESS }
	s.GpmMetricsGetFunc = func(m *nvml.GpmMetricsGetType) nvml.Return {
		s1, ok1 := m.Sample1.(*gpmSample)
		s2, ok2 := m.Sample2.(*gpmSample)
		if !ok1 || !ok2 || s1.index < 0 || s1.index != s2.index {
			return nvml.ERROR_INVALID_ARGUMENT
		}
		u, ret := readUsage(path, s2.index)
		if ret != nvml.SUCCESS {
			return ret
		}
		for i := range min(int(m.NumMetrics), len(m.Metrics)) {
			metric := &m.Metrics[i]
			metric.NvmlReturn = uint32(nvml.SUCCESS)
			switch nvml.GpmMetricId(metric.MetricId) {
			case nvml.GPM_METRIC_SM_UTIL:
				metric.Value = u.SMActivityPercent
			case nvml.GPM_METRIC_DRAM_BW_UTIL:
				metric.Value = u.DRAMActivityPercent
			default:
				metric.NvmlReturn = uint32(nvml.ERROR_NOT_SUPPORTED)
			}
		}
		return nvml.SUCCESS
	}
}

func boolToUint32(b bool) uint32 {
	if b {
		return 1
	}
	return 0
}
