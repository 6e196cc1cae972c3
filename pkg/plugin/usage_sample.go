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
	"bytes"
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

	"github.com/prismgpu/prism/pkg/checkpoint"
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

// tenant is a claim sharing a GPU, as attribution sees it.
type tenant struct {
	uid  string
	pods map[types.UID]bool
	// mps: the GPU's MPS daemon enforces the claim's share, so that the
	// claim's processes are clients of the GPU's MPS server.
	mps bool
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
	tenants := map[string][]tenant{}
	u.mu.Lock()
	for uid, t := range u.claims {
		rec, ok := d.checkpoint.Get(uid)
		if !ok {
			gone = append(gone, uid)
			continue
		}
		s := claimSnapshot{uid: uid, devices: t.devices, pods: map[types.UID]bool{}}
		for _, p := range t.rec.Pods {
			s.pods[p.UID] = true
		}
		mps := d.mpsGPUs(rec)
		for _, dev := range t.devices {
			n := needs[dev.uuid]
			if dev.shared {
				n.procs = true
				tenants[dev.uuid] = append(tenants[dev.uuid], tenant{uid: uid, pods: s.pods, mps: mps[dev.uuid]})
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
	owners := &podOwners{root: u.cfg.ProcRoot, byPID: map[uint32]podOwner{}, servers: map[uint32]bool{}}
	shares := make(map[string]map[string]*share, len(tenants))
	for uuid, ts := range tenants {
		if r := readings[uuid]; r != nil {
			shares[uuid] = r.attribute(ts, owners)
			logMPSUnsplit(ctx, uuid, r.reader, shares[uuid])
		}
	}
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
			sample := r.whole()
			if dev.shared {
				sh := shares[dev.uuid][s.uid]
				sample = sh.sample(r.procUtil)
				res.unattributed += sh.unreadable
				if sh.unreadable > 0 {
					d.metrics.usage.unattributed.WithLabelValues(unattributedUnreadable).Inc()
				}
				if sh.mpsServer {
					d.metrics.usage.unattributed.WithLabelValues(unattributedMPSServer).Inc()
				}
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
			klog.FromContext(ctx).Info("Leaving figures out of a claim's usage samples on a shared GPU: processes on the GPU whose cgroup cannot be read could be the claim's (is the plugin in the host's PID namespace?); a figure they could hide is left out rather than recorded too low, so the claim's run may be too short to merge",
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

// whole is the sample of a GPU the claim holds alone: the whole GPU's
// figures are the claim's.
func (r *deviceReading) whole() usage.Sample {
	return usage.Sample{DutyCyclePercent: r.dutyCycle, MemoryBytes: r.memory, SMActivityPercent: r.sm, DRAMActivityPercent: r.dram}
}

// share is what attribution gives a claim of a shared GPU's reading.
type share struct {
	util   int
	memory int64
	// utilUnknown and memoryUnknown are set where a process that could be
	// the claim's could not be counted.
	utilUnknown, memoryUnknown bool
	// unreadable counts the processes whose cgroup could not be read that
	// made a figure unknown; mpsServer is set where the MPS server's did.
	unreadable int
	mpsServer  bool
}

func (s *share) add(p *procUsage) {
	s.util += p.util
	if p.memory == usage.Unknown || s.memory == usage.Unknown {
		s.memory = usage.Unknown
	} else {
		s.memory += p.memory
	}
}

// hide marks unknown the figures that p could add to the claim's: its
// utilisation if it has any, its memory if it holds any. It reports
// whether it marked one.
func (s *share) hide(p *procUsage) bool {
	hid := false
	if p.util > 0 {
		s.utilUnknown, hid = true, true
	}
	if p.memory != 0 {
		s.memoryUnknown, hid = true, true
	}
	return hid
}

// sample is the claim's sample of the GPU. GPM counts the whole GPU, the
// neighbours' work too, so a share has none.
func (s *share) sample(procUtil bool) usage.Sample {
	out := usage.Sample{DutyCyclePercent: usage.Unknown, MemoryBytes: s.memory, SMActivityPercent: usage.Unknown, DRAMActivityPercent: usage.Unknown}
	if procUtil && !s.utilUnknown {
		out.DutyCyclePercent = min(s.util, 100)
	}
	if s.memoryUnknown {
		out.MemoryBytes = usage.Unknown
	}
	return out
}

// attribute splits a shared GPU's reading among the claims sharing it, by
// claim UID. A claim's figures are the sums of its own processes', told by
// their pod cgroup; a neighbour's use is never counted as the claim's.
//
// A process that cannot be told to be one claim's costs only the figures
// it could hide, and only to the claims it could belong to: such a figure
// is left unknown rather than recorded too low, because a share sized from
// too low a figure is too small. Every other figure, and every claim the
// process cannot belong to, is recorded as usual:
//
//   - A process read in an earlier cycle keeps the owner it had while NVML
//     lists it: an exited process's last samples are its own pod's, and no
//     neighbour's.
//   - A process whose cgroup cannot be read, and never could, may be any
//     claim's on the GPU or none's (a host process, where the plugin does
//     not see the host's PIDs). For every claim here it makes the
//     utilisation unknown if it has any, and the memory if it holds any;
//     an exited process's empty sample costs nothing.
//   - The MPS server (nvidia-cuda-mps-server outside the claims' pods)
//     stands for its clients, which are the claims whose shares the GPU's
//     MPS daemon enforces, and never for the others. NVML may list a
//     client's work under the client's PID or under the server's. The
//     server runs no kernel of its own, so any utilisation under its PID is
//     its clients'. Its memory is its own context where a client shows
//     memory under its own PID, and its clients' where none does. With one
//     client claim, both are that claim's; with several, how they split is
//     unknown, and the figure is left unknown for each.
func (r *deviceReading) attribute(tenants []tenant, owners *podOwners) map[string]*share {
	out := make(map[string]*share, len(tenants))
	for _, t := range tenants {
		out[t.uid] = &share{}
	}
	var remembered map[uint32]procOwner
	if r.reader != nil {
		remembered = r.reader.owners
	}
	seen := make(map[uint32]procOwner, len(r.procs))
	var servers, unreadable []*procUsage
	clientMemory := false
	for pid, p := range r.procs {
		var o procOwner
		if uid, err := owners.of(pid); err == nil {
			o.pod = uid
		} else if known, ok := remembered[pid]; ok {
			o = known
		} else {
			unreadable = append(unreadable, p)
			continue
		}
		claimed := false
		for _, t := range tenants {
			if t.pods[o.pod] {
				out[t.uid].add(p)
				claimed = true
				if t.mps && p.memory != 0 {
					clientMemory = true
				}
			}
		}
		if !claimed && (o.mpsServer || owners.mpsServer(pid)) {
			o.mpsServer = true
			servers = append(servers, p)
		}
		seen[pid] = o
	}
	if r.reader != nil {
		r.reader.owners = seen
	}

	var clients []*share
	for _, t := range tenants {
		if t.mps {
			clients = append(clients, out[t.uid])
		}
	}
	for _, p := range servers {
		held := *p
		if clientMemory {
			held.memory = 0
		}
		switch len(clients) {
		case 0:
		case 1:
			clients[0].add(&held)
		default:
			for _, s := range clients {
				if s.hide(&held) {
					s.mpsServer = true
				}
			}
		}
	}
	for _, p := range unreadable {
		for _, s := range out {
			if s.hide(p) {
				s.unreadable++
			}
		}
	}
	return out
}

// logMPSUnsplit says when the MPS server of a GPU starts and stops holding
// figures of several claims, which the claims' samples then lack.
func logMPSUnsplit(ctx context.Context, uuid string, rd *deviceReader, shares map[string]*share) {
	unsplit := false
	for _, s := range shares {
		unsplit = unsplit || s.mpsServer
	}
	if rd == nil || rd.mpsUnsplit == unsplit {
		return
	}
	rd.mpsUnsplit = unsplit
	logger := klog.FromContext(ctx).V(2)
	if unsplit {
		logger.Info("NVML lists the work of several MPS shares of a GPU under the MPS server's PID: their samples lack what it holds (utilisation, or memory where no client shows its own) until it lists them apart", "gpu", uuid)
	} else {
		logger.Info("The MPS server of a GPU no longer holds figures of several shares", "gpu", uuid)
	}
}

// mpsGPUs are the GPUs, by UUID, whose MPS daemon enforces the claim's share.
func (d *Driver) mpsGPUs(rec checkpoint.Claim) map[string]bool {
	var out map[string]bool
	for _, dev := range rec.Devices {
		if dev.Sharing == nil || !dev.Sharing.MPS {
			continue
		}
		if g, ok := d.device(dev.Name); ok {
			if out == nil {
				out = map[string]bool{}
			}
			out[g.UUID] = true
		}
	}
	return out
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

// procOwner is whose a GPU process is.
type procOwner struct {
	// pod is the UID of the pod whose container runs the process; "" for
	// one outside any pod.
	pod types.UID
	// mpsServer: the process is an MPS server outside the claims' pods.
	mpsServer bool
}

// podOwners tells which pod a GPU process belongs to, from its cgroup,
// and whether it is an MPS server, once per process per cycle.
type podOwners struct {
	root    string
	byPID   map[uint32]podOwner
	servers map[uint32]bool
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

// mpsServerCommand is what an MPS server runs. Its /proc/<pid>/comm is cut
// to 15 characters, nvidia-cuda-mps, as the control daemon's is: the
// command line tells them apart.
const mpsServerCommand = "nvidia-cuda-mps-server"

// mpsServer says whether pid runs the MPS server; false where its command
// line cannot be read.
func (o *podOwners) mpsServer(pid uint32) bool {
	if is, ok := o.servers[pid]; ok {
		return is
	}
	cmdline, err := os.ReadFile(filepath.Join(o.root, fmt.Sprint(pid), "cmdline"))
	argv0, _, _ := bytes.Cut(cmdline, []byte{0})
	is := err == nil && filepath.Base(string(argv0)) == mpsServerCommand
	o.servers[pid] = is
	return is
}
