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

package soak

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// FaultKinds are what the injector does, each in turn in an order shuffled
// per round, so that a short soak still sees every kind.
var FaultKinds = []string{
	"plugin-sigkill",    // the kubelet plugin crashes and its DaemonSet restarts it
	"plugin-restart",    // the plugin's container restarts, taking the MPS daemons it runs with it
	"controller-kill",   // the controller replica serving admission crashes
	"apiserver-restart", // kube-apiserver restarts
	"etcd-restart",      // etcd restarts under kube-apiserver
	"kubelet-restart",   // the kubelet restarts with claims prepared
	"hostile-reports",   // a tenant fills its report directory with hostile reports
}

// recoverWithin bounds the wait for a canary pod after a fault.
const recoverWithin = 5 * time.Minute

// inject injects a fault every opts.FaultEvery on average until ctx ends,
// and after each, measures recovery and checks the invariants. base
// outlives ctx, so that the last fault is recovered from.
func (s *soak) inject(ctx, base context.Context, rng *rand.Rand) {
	var order []string
	for {
		gap := s.opts.FaultEvery/2 + time.Duration(rng.Int64N(int64(s.opts.FaultEvery)))
		if !sleep(ctx, gap) {
			return
		}
		if len(order) == 0 {
			order = append([]string(nil), s.opts.Faults...)
			if len(order) == 0 {
				order = append(order, FaultKinds...)
			}
			rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		}
		kind := order[0]
		order = order[1:]
		node := nodes[rng.IntN(len(nodes))].Name
		f := Fault{Kind: kind, Target: node, At: s.since().Round(time.Second)}
		s.logf("fault %s on %s", kind, node)
		start := time.Now()
		if err := s.injectOne(base, kind, node); err != nil {
			f.Err = err.Error()
			s.violate(kind, "recovery", "the fault itself failed: %v", err)
		}
		f.Restored = time.Since(start)
		if err := s.canary(base, node); err != nil {
			f.Err = err.Error()
			s.violate(kind, "recovery", "no new pod ran on %s within %s: %v", node, recoverWithin, err)
		}
		f.Recovery = time.Since(start)
		s.mu.Lock()
		s.res.Faults = append(s.res.Faults, f)
		s.mu.Unlock()
		s.logf("recovered from %s in %s (component back in %s)", kind, f.Recovery.Round(100*time.Millisecond), f.Restored.Round(100*time.Millisecond))
		s.checkAll(base, kind, false)
	}
}

func (s *soak) injectOne(ctx context.Context, kind, node string) error {
	switch kind {
	case "plugin-sigkill":
		return s.bed.KillPlugin(ctx, node)
	case "plugin-restart":
		return s.bed.RestartPluginContainer(ctx, node)
	case "controller-kill":
		return s.bed.KillServingController(ctx)
	case "apiserver-restart":
		return s.cluster.RestartAPIServer(ctx)
	case "etcd-restart":
		return s.cluster.RestartEtcd(ctx)
	case "kubelet-restart":
		for _, n := range s.cluster.Nodes() {
			if n.Name == node {
				n.StopKubelet()
				if err := n.StartKubelet(ctx); err != nil {
					return err
				}
				return n.WaitReady(ctx, 2*time.Minute)
			}
		}
		return fmt.Errorf("no node %s", node)
	case "hostile-reports":
		return s.hostileRun(ctx, node)
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// canaryMemory is the canary's share: small, so that it fits unless every
// GPU of the node is held whole, and its wait measures the fault rather
// than the churn's load.
const canaryMemory = "1Gi"

// canary runs a pod with a small share of a GPU on node and deletes it:
// the node serves again once it runs.
func (s *soak) canary(ctx context.Context, node string) error {
	name := fmt.Sprintf("canary-%d", s.seq.Add(1))
	if err := s.createPod(ctx, pod(name, "canary", node), recoverWithin); err != nil {
		return err
	}
	defer s.deletePod(ctx, "recovery", name)
	_, err := s.waitRunning(ctx, name, recoverWithin)
	return err
}

// hostileRun runs a profiled pod on node whose "ncu" leaves what a hostile
// tenant would: a report of half a million launches with a kernel name
// each, and a thousand other files. The plugin must collect it within its
// memory limit and go on serving.
func (s *soak) hostileRun(ctx context.Context, node string) error {
	name := fmt.Sprintf("hostile-%d", s.seq.Add(1))
	if err := s.createProfiledTemplate(ctx, name, name); err != nil {
		return err
	}
	defer s.deleteTemplate(ctx, name)
	if err := s.createPod(ctx, pod(name, name, node), time.Minute); err != nil {
		return err
	}
	defer s.deletePod(ctx, "recovery", name)
	running, err := s.waitRunning(ctx, name, startWithin)
	if err != nil {
		return err
	}
	dir, err := s.claimDir(ctx, running)
	if err != nil {
		return err
	}
	// Running out of space on the size-limited report directory is the
	// tenant's problem, not the soak's: what was written is what the
	// plugin reads.
	written, err := writeHostileReport(filepath.Join(dir, profiling.ReportFile), 500_000)
	files := 0
	for ; files < 1000; files++ {
		if os.WriteFile(filepath.Join(dir, "junk-"+strconv.Itoa(files)+".csv"), []byte("x\n"), 0o644) != nil {
			break
		}
	}
	s.logf("%s wrote a %.1f MiB report (%v) and %d other files", name, float64(written)/(1<<20), err, files)
	return nil
}

// writeHostileReport writes n launches, each with a kernel of its own, and
// says how many bytes it wrote.
func writeHostileReport(path string, n int) (int64, error) {
	f, err := os.Create(path)
	if err != nil {
		return 0, err
	}
	c := &countingWriter{w: f}
	w := bufio.NewWriter(c)
	fmt.Fprintln(w, `"ID","Kernel Name","Device","CC","Metric Name","Metric Unit","Metric Value"`)
	for i := range n {
		fmt.Fprintf(w, `"%d","k%d","0","9.0","Duration","nsecond","%d"`+"\n", i, i, i)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return c.n, err
	}
	return c.n, f.Close()
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// sampleRSS reads each plugin's resident set every half second; a peak over
// the chart's limit is a violation, reported once per node.
func (s *soak) sampleRSS(ctx context.Context) {
	wait.UntilWithContext(ctx, func(context.Context) {
		for _, n := range nodes {
			rss, err := rssBytes(s.bed.PluginPID(n.Name))
			if err != nil {
				continue // between a kill and the restart
			}
			mib := float64(rss) / (1 << 20)
			s.mu.Lock()
			if mib > s.res.PluginPeakRSSMiB[n.Name] {
				s.res.PluginPeakRSSMiB[n.Name] = mib
			}
			over := rss > s.limitBytes && !s.reported["rss/"+n.Name]
			if over {
				s.reported["rss/"+n.Name] = true
			}
			s.mu.Unlock()
			if over {
				s.violate("sampling", "memory", "plugin on %s at %.0f MiB, over its limit of %.0f MiB", n.Name, mib, s.res.PluginLimitMiB)
			}
		}
	}, 500*time.Millisecond)
}

// rssBytes is VmRSS of a process.
func rssBytes(pid int) (int64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kib, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kib << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS for pid %d", pid)
}
