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

package sampler

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/usage"
)

// deviceReader reads one GPU's usage across cycles.
type deviceReader struct {
	handle nvml.Device
	// lastSeen is the newest process utilisation sample read, in NVML's
	// microseconds, so that each cycle reads only newer ones.
	lastSeen uint64
	// gpm is nil where the GPU has no GPM.
	gpm *gpmReader
	// owners are whose the GPU's processes were when last read, kept while
	// NVML lists them: a process that exited is still its pod's.
	owners map[uint32]procOwner
	// mpsUnsplit is set while the GPU's MPS server holds figures of
	// several claims, so that the log says when that starts and ends.
	mpsUnsplit bool
}

// gpmReader turns two GPM samples into the metrics between them; the
// metrics struct is large and kept, not rebuilt every cycle.
type gpmReader struct {
	samples [2]nvml.GpmSample
	// cur is the sample the next read fills; primed once the other holds one.
	cur     int
	primed  bool
	metrics nvml.GpmMetricsGetType
}

// deviceReading is what one cycle read of a GPU.
type deviceReading struct {
	// Whole-GPU figures, usage.Unknown where not read.
	dutyCycle int
	memory    int64
	sm, dram  float64
	// procs are the GPU's processes, read where a share of it is sampled;
	// procUtil is false where NVML gives no per-process utilisation.
	procs    map[uint32]*procUsage
	procUtil bool
	// reader is the GPU's, which remembers its processes' owners.
	reader *deviceReader
}

type procUsage struct {
	memory int64
	util   int
}

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE for a process's memory.
const notAvailable = ^uint64(0)

// initNVML initialises NVML for the sampler once; false when it cannot,
// which was logged.
func (s *Sampler) initNVML(ctx context.Context) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nvmlReady {
		return true
	}
	if ret := s.cfg.NVML.Init(); ret != nvml.SUCCESS {
		klog.FromContext(ctx).Error(ret, "Initialising NVML to sample GPU usage; retrying next cycle")
		return false
	}
	s.nvmlReady = true
	return true
}

func (s *Sampler) shutdownNVML(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for uuid, r := range s.readers {
		r.free()
		delete(s.readers, uuid)
	}
	if s.nvmlReady {
		if ret := s.cfg.NVML.Shutdown(); ret != nvml.SUCCESS {
			klog.FromContext(ctx).Error(ret, "Shutting down NVML after sampling GPU usage")
		}
		s.nvmlReady = false
	}
}

// need is what a cycle must read of a GPU.
type need struct{ whole, procs bool }

// read reads what the cycle needs of one GPU; nil when the GPU cannot be
// read at all, which is logged (its health is the health watch's job).
func (s *Sampler) read(ctx context.Context, uuid string, n need) *deviceReading {
	logger := klog.FromContext(ctx)
	s.mu.Lock()
	rd, ok := s.readers[uuid]
	s.mu.Unlock()
	if !ok {
		h, ret := s.cfg.NVML.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			logger.V(2).Info("Cannot sample a GPU's usage", "gpu", uuid, "err", ret.Error())
			return nil
		}
		rd = &deviceReader{handle: h, gpm: newGPMReader(s.cfg.NVML, h)}
		s.mu.Lock()
		s.readers[uuid] = rd
		s.mu.Unlock()
	}
	r := &deviceReading{dutyCycle: usage.Unknown, memory: usage.Unknown, sm: usage.Unknown, dram: usage.Unknown, reader: rd}
	if n.whole {
		if util, ret := rd.handle.GetUtilizationRates(); ret == nvml.SUCCESS {
			r.dutyCycle = int(util.Gpu)
		} else {
			logger.V(4).Info("No utilisation", "gpu", uuid, "err", ret.Error())
		}
		if mem, ret := rd.handle.GetMemoryInfo(); ret == nvml.SUCCESS {
			r.memory = int64(mem.Used)
		}
		if rd.gpm != nil {
			r.sm, r.dram = rd.gpm.read(s.cfg.NVML, rd.handle)
		}
	}
	if n.procs {
		r.procs = map[uint32]*procUsage{}
		procs, ret := rd.handle.GetComputeRunningProcesses()
		if ret != nvml.SUCCESS {
			logger.V(2).Info("Cannot list a shared GPU's processes", "gpu", uuid, "err", ret.Error())
			return nil
		}
		for _, p := range procs {
			m := int64(usage.Unknown)
			if p.UsedGpuMemory != notAvailable {
				m = int64(p.UsedGpuMemory)
			}
			r.procs[p.Pid] = &procUsage{memory: m}
		}
		samples, ret := rd.handle.GetProcessUtilization(rd.lastSeen)
		switch ret {
		case nvml.SUCCESS, nvml.ERROR_NOT_FOUND:
			// NOT_FOUND: no process ran a kernel since the last read.
			r.procUtil = true
		default:
			logger.V(4).Info("No per-process utilisation", "gpu", uuid, "err", ret.Error())
		}
		// A process may have several samples since the last read: take
		// their mean, as the GPU's own utilisation is a mean over its period.
		sums, counts := map[uint32]int{}, map[uint32]int{}
		for _, ps := range samples {
			if ps.TimeStamp <= rd.lastSeen {
				continue
			}
			sums[ps.Pid] += int(ps.SmUtil)
			counts[ps.Pid]++
		}
		for _, ps := range samples {
			rd.lastSeen = max(rd.lastSeen, ps.TimeStamp)
		}
		for pid, n := range counts {
			p, ok := r.procs[pid]
			if !ok {
				p = &procUsage{memory: 0}
				r.procs[pid] = p
			}
			p.util = sums[pid] / n
		}
	}
	return r
}

// whole is the sample of a GPU the claim holds alone: the whole GPU's
// figures are the claim's.
func (r *deviceReading) whole() usage.Sample {
	return usage.Sample{DutyCyclePercent: r.dutyCycle, MemoryBytes: r.memory, SMActivityPercent: r.sm, DRAMActivityPercent: r.dram}
}

func (rd *deviceReader) free() {
	if rd.gpm != nil {
		for _, s := range rd.gpm.samples {
			s.Free()
		}
	}
}

// newGPMReader allocates the GPM samples of a GPU that has GPM; nil
// otherwise (before Hopper, or a driver without it).
func newGPMReader(lib nvml.Interface, h nvml.Device) *gpmReader {
	support, ret := h.GpmQueryDeviceSupport()
	if ret != nvml.SUCCESS || support.IsSupportedDevice == 0 {
		return nil
	}
	g := &gpmReader{}
	for i := range g.samples {
		s, ret := lib.GpmSampleAlloc()
		if ret != nvml.SUCCESS {
			for _, prev := range g.samples[:i] {
				prev.Free()
			}
			return nil
		}
		g.samples[i] = s
	}
	return g
}

// read takes a GPM sample and returns SM activity and DRAM bandwidth use
// since the previous one, in per cent; usage.Unknown on the first read
// and on errors.
func (g *gpmReader) read(lib nvml.Interface, h nvml.Device) (sm, dram float64) {
	sm, dram = usage.Unknown, usage.Unknown
	if ret := h.GpmSampleGet(g.samples[g.cur]); ret != nvml.SUCCESS {
		g.primed = false
		return sm, dram
	}
	prev := 1 - g.cur
	g.cur = prev
	if !g.primed {
		g.primed = true
		return sm, dram
	}
	m := &g.metrics
	m.NumMetrics = 2
	m.Sample1, m.Sample2 = g.samples[g.cur], g.samples[1-g.cur]
	m.Metrics[0] = nvml.GpmMetric{MetricId: uint32(nvml.GPM_METRIC_SM_UTIL)}
	m.Metrics[1] = nvml.GpmMetric{MetricId: uint32(nvml.GPM_METRIC_DRAM_BW_UTIL)}
	if ret := lib.GpmMetricsGet(m); ret != nvml.SUCCESS {
		return sm, dram
	}
	if m.Metrics[0].NvmlReturn == uint32(nvml.SUCCESS) {
		sm = m.Metrics[0].Value
	}
	if m.Metrics[1].NvmlReturn == uint32(nvml.SUCCESS) {
		dram = m.Metrics[1].Value
	}
	return sm, dram
}
