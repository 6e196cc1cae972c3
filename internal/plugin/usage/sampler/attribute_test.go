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
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

// fakeProc is a GPU process's entry in a fake /proc.
type fakeProc struct {
	// pod is the UID of the pod whose cgroup the process is in.
	pod types.UID
	// server: the process runs nvidia-cuda-mps-server.
	server bool
	// pipeDir is the CUDA_MPS_PIPE_DIRECTORY in its environment; the
	// environment cannot be read where it is "".
	pipeDir string
}

// write puts the process into the fake /proc at root.
func (p fakeProc) write(t *testing.T, root string, pid uint32) {
	t.Helper()
	dir := filepath.Join(root, fmt.Sprint(pid))
	cmdline := "python\x00train.py\x00"
	if p.server {
		cmdline = "/usr/bin/nvidia-cuda-mps-server\x00"
	}
	files := map[string]string{
		"cgroup":  "0::/kubepods.slice/kubepods-pod" + string(p.pod) + ".slice/cri-containerd-0123.scope\n",
		"cmdline": cmdline,
	}
	if p.pipeDir != "" {
		files["environ"] = "PATH=/usr/bin\x00" + mps.EnvPipeDirectory + "=" + p.pipeDir + "\x00CUDA_MPS_LOG_DIRECTORY=/var/log\x00"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// figures are what attribution gave a claim: its sample's duty cycle and
// memory (usage.Unknown where left unknown), and whether an MPS server
// holding several claims' work made one unknown.
type figures struct {
	Duty      int
	Memory    int64
	MPSServer bool
}

// TestAttributeMPSServers: an MPS server's figures are its clients'. The
// server of a share's own daemon, whose environment names the daemon's
// pipe directory, serves that share alone; one that cannot be told serves
// every MPS share of the GPU. Claims a and b are MPS shares of the GPU;
// claim c shares it time-sliced and is never a server's client.
func TestAttributeMPSServers(t *testing.T) {
	const (
		podA      types.UID = "aaaaaaaa-0000-0000-0000-000000000000"
		podB      types.UID = "bbbbbbbb-0000-0000-0000-000000000000"
		podC      types.UID = "cccccccc-0000-0000-0000-000000000000"
		pluginPod types.UID = "ffffffff-0000-0000-0000-000000000000"
		pipeA               = "/var/lib/prism/mps/claim-a-gpu-0/pipe"
		pipeB               = "/var/lib/prism/mps/claim-b-gpu-0/pipe"
		// pipeGPU is the pipe directory of the GPU's daemon, which the
		// previous release ran for all its MPS shares.
		pipeGPU = "/var/lib/prism/mps/GPU-0/pipe"
	)
	for _, tc := range []struct {
		name string
		// pipeA and pipeB are the claims' own daemons' pipe directories,
		// "" for a share of the GPU's daemon.
		pipeA, pipeB string
		procs        map[uint32]fakeProc
		usage        map[uint32]procUsage
		// exited leave /proc after a first cycle; a second, whose figures
		// are wanted, still lists them.
		exited []uint32
		want   map[string]figures
	}{
		{
			// The memory a's server holds is a's, which shows none of its
			// own; b's shows its own, so its server's is the server's
			// context.
			name:  "each share's server is its own",
			pipeA: pipeA, pipeB: pipeB,
			procs: map[uint32]fakeProc{
				50:  {pod: pluginPod, server: true, pipeDir: pipeA},
				51:  {pod: pluginPod, server: true, pipeDir: pipeB},
				200: {pod: podB}, 300: {pod: podC},
			},
			usage: map[uint32]procUsage{
				50: {util: 70, memory: 6 << 30}, 51: {util: 20, memory: 32 << 20},
				200: {memory: 4 << 30}, 300: {util: 10, memory: 2 << 30},
			},
			want: map[string]figures{
				"a": {Duty: 70, Memory: 6 << 30}, "b": {Duty: 20, Memory: 4 << 30}, "c": {Duty: 10, Memory: 2 << 30},
			},
		},
		{
			name:  "a share's server that exited is still its own",
			pipeA: pipeA, pipeB: pipeB,
			procs: map[uint32]fakeProc{
				50: {pod: pluginPod, server: true, pipeDir: pipeA},
				51: {pod: pluginPod, server: true, pipeDir: pipeB},
			},
			usage:  map[uint32]procUsage{50: {util: 70, memory: 6 << 30}, 51: {util: 20, memory: 4 << 30}},
			exited: []uint32{50},
			want: map[string]figures{
				"a": {Duty: 70, Memory: 6 << 30}, "b": {Duty: 20, Memory: 4 << 30}, "c": {},
			},
		},
		{
			// It could be a's server or b's.
			name:  "a server whose environment cannot be read",
			pipeA: pipeA, pipeB: pipeB,
			procs: map[uint32]fakeProc{
				50:  {pod: pluginPod, server: true},
				100: {pod: podA}, 200: {pod: podB}, 300: {pod: podC},
			},
			usage: map[uint32]procUsage{
				50:  {util: 70, memory: 32 << 20},
				100: {memory: 6 << 30}, 200: {memory: 4 << 30}, 300: {util: 10, memory: 2 << 30},
			},
			want: map[string]figures{
				"a": {Duty: usage.Unknown, Memory: 6 << 30, MPSServer: true}, "b": {Duty: usage.Unknown, Memory: 4 << 30, MPSServer: true},
				"c": {Duty: 10, Memory: 2 << 30},
			},
		},
		{
			name:  "a server of another daemon",
			pipeA: pipeA, pipeB: pipeB,
			procs: map[uint32]fakeProc{
				50: {pod: pluginPod, server: true, pipeDir: pipeGPU},
			},
			usage: map[uint32]procUsage{50: {util: 70, memory: 10 << 30}},
			want: map[string]figures{
				"a": {Duty: usage.Unknown, Memory: usage.Unknown, MPSServer: true}, "b": {Duty: usage.Unknown, Memory: usage.Unknown, MPSServer: true},
				"c": {},
			},
		},
		{
			// a was prepared by the previous release. b's server is b's
			// alone; the GPU's daemon's could serve either.
			name:  "a share of the GPU's daemon beside a share with its own",
			pipeB: pipeB,
			procs: map[uint32]fakeProc{
				50:  {pod: pluginPod, server: true, pipeDir: pipeGPU},
				51:  {pod: pluginPod, server: true, pipeDir: pipeB},
				100: {pod: podA}, 200: {pod: podB},
			},
			usage: map[uint32]procUsage{
				50: {util: 30, memory: 32 << 20}, 51: {util: 20, memory: 32 << 20},
				100: {memory: 6 << 30}, 200: {memory: 4 << 30},
			},
			want: map[string]figures{
				"a": {Duty: usage.Unknown, Memory: 6 << 30, MPSServer: true}, "b": {Duty: usage.Unknown, Memory: 4 << 30, MPSServer: true},
				"c": {},
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			for pid, p := range tc.procs {
				p.write(t, root, pid)
			}
			tenants := []tenant{
				{uid: "a", pods: map[types.UID]bool{podA: true}, mps: true, mpsPipeDir: tc.pipeA},
				{uid: "b", pods: map[types.UID]bool{podB: true}, mps: true, mpsPipeDir: tc.pipeB},
				{uid: "c", pods: map[types.UID]bool{podC: true}},
			}
			reader := &deviceReader{}
			cycle := func() map[string]*share {
				r := &deviceReading{procs: map[uint32]*procUsage{}, procUtil: true, reader: reader}
				for pid, u := range tc.usage {
					r.procs[pid] = &u
				}
				return r.attribute(tenants, newPodOwners(root))
			}
			cycle()
			for _, pid := range tc.exited {
				if err := os.RemoveAll(filepath.Join(root, fmt.Sprint(pid))); err != nil {
					t.Fatal(err)
				}
			}
			got := map[string]figures{}
			for uid, s := range cycle() {
				sample := s.sample(true)
				got[uid] = figures{Duty: sample.DutyCyclePercent, Memory: sample.MemoryBytes, MPSServer: s.mpsServer}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("claims' figures (-want +got):\n%s", diff)
			}
		})
	}
}
