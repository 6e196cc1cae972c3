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
	"regexp"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/pkg/usage"
)

// deviceReader reads one GPU's usage across cycles.
type deviceReader struct {
	handle nvml.Device
	// lastSeen is the newest process utilisation sample read, in NVML's
	// microseconds, so that each cycle reads only newer ones.
	lastSeen uint64
	// gpm is nil where the GPU has no GPM.
	gpm *gpmReader
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
}

type procUsage struct {
	memory int64
	util   int
}

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE for a process's memory.
const notAvailable = ^uint64(0)

// initNVML initialises NVML for the sampler once; false when it cannot,
// which was logged.
func (u *usageSampler) initNVML(ctx context.Context) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.nvmlReady {
		return true
	}
	if ret := u.cfg.NVML.Init(); ret != nvml.SUCCESS {
		klog.FromContext(ctx).Error(ret, "Initialising NVML to sample GPU usage; retrying next cycle")
		return false
	}
	u.nvmlReady = true
	return true
}

func (u *usageSampler) shutdownNVML(ctx context.Context) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for uuid, r := range u.readers {
		r.free()
		delete(u.readers, uuid)
	}
	if u.nvmlReady {
		if ret := u.cfg.NVML.Shutdown(); ret != nvml.SUCCESS {
			klog.FromContext(ctx).Error(ret, "Shutting down NVML after sampling GPU usage")
		}
		u.nvmlReady = false
	}
}

// need is what a cycle must read of a GPU.
type need struct{ whole, procs bool }

// claimSnapshot is what a cycle needs of a tracked claim, copied so that
// NVML and /proc are read without the lock.
type claimSnapshot struct {
	uid     string
	devices []trackedDevice
	pods    map[types.UID]bool
}

// sampleUsage reads every tracked claim's GPUs once and adds the samples to
// their runs. Claims released by another path than unprepare (the
// stale-claim sweep, start-up reconciliation) end here.
func (d *Driver) sampleUsage(ctx context.Context) {
	u := d.usage
	if !u.initNVML(ctx) {
		return
	}
	var gone []string
	var snapshot []claimSnapshot
	needs := map[string]need{}
	u.mu.Lock()
	for uid, t := range u.claims {
		if _, ok := d.checkpoint.Get(uid); !ok {
			gone = append(gone, uid)
			continue
		}
		s := claimSnapshot{uid: uid, devices: t.devices, pods: map[types.UID]bool{}}
		for _, p := range t.rec.Pods {
			s.pods[p.UID] = true
		}
		for _, dev := range t.devices {
			n := needs[dev.uuid]
			if dev.shared {
				n.procs = true
			} else {
				n.whole = true
			}
			needs[dev.uuid] = n
		}
		snapshot = append(snapshot, s)
	}
	// Readers of GPUs no claim uses any more go, with their GPM samples.
	for uuid, r := range u.readers {
		if _, ok := needs[uuid]; !ok {
			r.free()
			delete(u.readers, uuid)
		}
	}
	u.mu.Unlock()
	d.releaseUsage(ctx, gone)

	readings := make(map[string]*deviceReading, len(needs))
	for uuid, n := range needs {
		readings[uuid] = u.read(ctx, uuid, n)
	}
	owners := &podOwners{root: u.cfg.ProcRoot, byPID: map[uint32]podOwner{}}
	type result struct {
		uid          string
		samples      []usage.Sample
		gpus         []string
		unattributed int
	}
	results := make([]result, 0, len(snapshot))
	for _, s := range snapshot {
		res := result{uid: s.uid}
		for _, dev := range s.devices {
			r := readings[dev.uuid]
			if r == nil {
				continue
			}
			sample, unattributed := r.sampleFor(dev.shared, s.pods, owners)
			if unattributed > 0 {
				res.unattributed += unattributed
				continue
			}
			res.samples = append(res.samples, sample)
			res.gpus = append(res.gpus, dev.uuid)
		}
		results = append(results, res)
	}

	u.mu.Lock()
	defer u.mu.Unlock()
	for _, res := range results {
		t, ok := u.claims[res.uid]
		if !ok {
			// Unprepared during the cycle.
			continue
		}
		if res.unattributed > 0 && !t.unattributed {
			t.unattributed = true
			klog.FromContext(ctx).Info("Dropping usage samples of a claim on a shared GPU: processes on the GPU could not be told to be the claim's or another pod's (is the plugin in the host's PID namespace?); a neighbour's use is never counted as the claim's, so its run may be too short to merge",
				"claim", klog.KRef(t.rec.Claim.Namespace, t.rec.Claim.Name), "processes", res.unattributed, "procRoot", u.cfg.ProcRoot)
		}
		pod := ""
		if len(t.rec.Pods) > 0 {
			pod = t.rec.Pods[0].Name
		}
		for i, s := range res.samples {
			t.rec.Run.Add(s)
			t.dirty = true
			d.metrics.usage.set(t.rec.Claim, pod, res.gpus[i], s)
		}
	}
}

// read reads what the cycle needs of one GPU; nil when the GPU cannot be
// read at all, which is logged (its health is the health watch's job).
func (u *usageSampler) read(ctx context.Context, uuid string, n need) *deviceReading {
	logger := klog.FromContext(ctx)
	u.mu.Lock()
	rd, ok := u.readers[uuid]
	u.mu.Unlock()
	if !ok {
		h, ret := u.cfg.NVML.DeviceGetHandleByUUID(uuid)
		if ret != nvml.SUCCESS {
			logger.V(2).Info("Cannot sample a GPU's usage", "gpu", uuid, "err", ret.Error())
			return nil
		}
		rd = &deviceReader{handle: h, gpm: newGPMReader(u.cfg.NVML, h)}
		u.mu.Lock()
		u.readers[uuid] = rd
		u.mu.Unlock()
	}
	r := &deviceReading{dutyCycle: usage.Unknown, memory: usage.Unknown, sm: usage.Unknown, dram: usage.Unknown}
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
			r.sm, r.dram = rd.gpm.read(u.cfg.NVML, rd.handle)
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
		for _, s := range samples {
			if s.TimeStamp <= rd.lastSeen {
				continue
			}
			sums[s.Pid] += int(s.SmUtil)
			counts[s.Pid]++
		}
		for _, s := range samples {
			rd.lastSeen = max(rd.lastSeen, s.TimeStamp)
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

// sampleFor is the claim's sample of this GPU: the whole GPU's figures
// when it holds it alone, else the sum of its own processes' figures. It
// returns how many processes could not be attributed, in which case the
// sample is not to be used: counting only those known to be the claim's
// would understate its use, and a share sized from that would be too small.
func (r *deviceReading) sampleFor(shared bool, pods map[types.UID]bool, owners *podOwners) (usage.Sample, int) {
	if !shared {
		return usage.Sample{DutyCyclePercent: r.dutyCycle, MemoryBytes: r.memory, SMActivityPercent: r.sm, DRAMActivityPercent: r.dram}, 0
	}
	// GPM counts the whole GPU, the neighbours' work too.
	s := usage.Sample{DutyCyclePercent: usage.Unknown, MemoryBytes: 0, SMActivityPercent: usage.Unknown, DRAMActivityPercent: usage.Unknown}
	util, unattributed := 0, 0
	for pid, p := range r.procs {
		owner, err := owners.of(pid)
		if err != nil {
			unattributed++
			continue
		}
		if !pods[owner] {
			continue
		}
		util += p.util
		if p.memory == usage.Unknown || s.MemoryBytes == usage.Unknown {
			s.MemoryBytes = usage.Unknown
		} else {
			s.MemoryBytes += p.memory
		}
	}
	if r.procUtil {
		s.DutyCyclePercent = min(util, 100)
	}
	return s, unattributed
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

// podOwners tells which pod a GPU process belongs to, from its cgroup,
// once per process per cycle.
type podOwners struct {
	root  string
	byPID map[uint32]podOwner
}

type podOwner struct {
	uid types.UID
	err error
}

// podUIDInCgroup finds a pod UID in a cgroup path, as the kubelet's cgroupfs
// driver writes it (pod<uid>) and its systemd driver (pod<uid with
// underscores>.slice).
var podUIDInCgroup = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})`)

// of returns the UID of the pod whose container runs pid: "" for a process
// outside any pod (such as an MPS server or nvidia-smi), an error where
// the process's cgroup cannot be read.
func (o *podOwners) of(pid uint32) (types.UID, error) {
	if cached, ok := o.byPID[pid]; ok {
		return cached.uid, cached.err
	}
	var owner podOwner
	data, err := os.ReadFile(filepath.Join(o.root, fmt.Sprint(pid), "cgroup"))
	switch {
	case err != nil:
		owner.err = fmt.Errorf("read the cgroup of GPU process %d: %w", pid, err)
	default:
		for _, line := range strings.Split(string(data), "\n") {
			if m := podUIDInCgroup.FindStringSubmatch(line); m != nil {
				owner.uid = types.UID(strings.ReplaceAll(m[1], "_", "-"))
				break
			}
		}
	}
	if o.root == "" {
		owner = podOwner{err: errors.New("no /proc to read GPU processes' cgroups from")}
	}
	o.byPID[pid] = owner
	return owner.uid, owner.err
}
