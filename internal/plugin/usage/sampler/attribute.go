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
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

// tenant is a claim sharing a GPU, as attribution sees it.
type tenant struct {
	uid  string
	pods map[types.UID]bool
	// mps: an MPS daemon enforces the claim's share, so that the claim's
	// processes are clients of an MPS server.
	mps bool
	// mpsPipeDir is the pipe directory of the share's own MPS daemon, whose
	// server serves the claim alone; "" where a daemon of the whole GPU
	// serves all its MPS shares, or the share's is not recorded.
	mpsPipeDir string
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
//   - An MPS server (nvidia-cuda-mps-server outside the claims' pods)
//     stands for its clients, and never for the others. The server of a
//     share's own MPS daemon has the daemon's pipe directory in its
//     environment, and its one client claim is that share's claim. A server
//     whose environment names no share's pipe directory (it is the GPU's
//     daemon's, or its environment cannot be read) may stand for any claim
//     whose share an MPS daemon enforces. NVML may list a client's work
//     under the client's PID or under the server's. The server runs no
//     kernel of its own, so any utilisation under its PID is its clients'.
//     Its memory is its own context where a client shows memory under its
//     own PID, and its clients' where none does. With one client claim,
//     both are that claim's; with several, how they split is unknown, and
//     the figure is left unknown for each.
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
	type server struct {
		*procUsage
		pipeDir string
	}
	var servers []server
	var unreadable []*procUsage
	// clientMemory: an MPS client shows memory under its own PID;
	// pipeMemory, by pipe directory: a client of the share whose own
	// daemon has it does.
	clientMemory, pipeMemory := false, map[string]bool{}
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
					clientMemory, pipeMemory[t.mpsPipeDir] = true, true
				}
			}
		}
		if !claimed && (o.mpsServer || owners.mpsServer(pid)) {
			if !o.mpsServer {
				o.mpsServer, o.mpsPipeDir = true, owners.mpsPipeDir(pid)
			}
			servers = append(servers, server{p, o.mpsPipeDir})
		}
		seen[pid] = o
	}
	if r.reader != nil {
		r.reader.owners = seen
	}

	var clients []*share
	byPipeDir := map[string]*share{}
	for _, t := range tenants {
		if t.mps {
			clients = append(clients, out[t.uid])
			if t.mpsPipeDir != "" {
				byPipeDir[t.mpsPipeDir] = out[t.uid]
			}
		}
	}
	for _, sv := range servers {
		served, shown := clients, clientMemory
		if own, ok := byPipeDir[sv.pipeDir]; ok {
			served, shown = []*share{own}, pipeMemory[sv.pipeDir]
		}
		held := *sv.procUsage
		if shown {
			held.memory = 0
		}
		switch len(served) {
		case 0:
		case 1:
			served[0].add(&held)
		default:
			for _, s := range served {
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

// procOwner is whose a GPU process is.
type procOwner struct {
	// pod is the UID of the pod whose container runs the process; "" for
	// one outside any pod.
	pod types.UID
	// mpsServer: the process is an MPS server outside the claims' pods.
	mpsServer bool
	// mpsPipeDir is the pipe directory in the MPS server's environment,
	// its control daemon's; "" where it names none or cannot be read.
	mpsPipeDir string
}

// podOwners tells which pod a GPU process belongs to, from its cgroup,
// whether it is an MPS server, and which daemon's, once per process per
// cycle.
type podOwners struct {
	root     string
	byPID    map[uint32]podOwner
	servers  map[uint32]bool
	pipeDirs map[uint32]string
}

// newPodOwners reads GPU processes from the /proc at root, "" for none.
func newPodOwners(root string) *podOwners {
	return &podOwners{root: root, byPID: map[uint32]podOwner{}, servers: map[uint32]bool{}, pipeDirs: map[uint32]string{}}
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

// mpsPipeDir is the pipe directory in the environment of the MPS server
// pid, which it has from the control daemon that started it; "" where its
// environment cannot be read or names none. The PID is the host's, as
// NVML gives it, so the server is read in the proc root and not by its
// parent, which may be in another PID namespace.
func (o *podOwners) mpsPipeDir(pid uint32) string {
	if dir, ok := o.pipeDirs[pid]; ok {
		return dir
	}
	// An unreadable environment is an empty one.
	environ, _ := os.ReadFile(filepath.Join(o.root, fmt.Sprint(pid), "environ"))
	dir := ""
	for _, v := range strings.Split(string(environ), "\x00") {
		if value, ok := strings.CutPrefix(v, mps.EnvPipeDirectory+"="); ok {
			dir = value
			break
		}
	}
	o.pipeDirs[pid] = dir
	return dir
}
