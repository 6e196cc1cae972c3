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

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/internal/plugin/usage"
)

// claimSnapshot is what a cycle needs of a tracked claim, copied so that
// NVML and /proc are read without the lock.
type claimSnapshot struct {
	uid  string
	gpus []GPU
	pods map[types.UID]bool
}

// Sample reads every tracked claim's GPUs once and adds the samples to
// their runs; Run calls it every interval. Claims released by another path
// than Release end here.
func (s *Sampler) Sample(ctx context.Context) {
	if !s.initNVML(ctx) {
		return
	}
	var gone []string
	var snapshot []claimSnapshot
	needs := map[string]need{}
	tenants := map[string][]tenant{}
	s.mu.Lock()
	for uid, t := range s.claims {
		if !s.env.Prepared(uid) {
			gone = append(gone, uid)
			continue
		}
		c := claimSnapshot{uid: uid, gpus: t.gpus, pods: map[types.UID]bool{}}
		for _, p := range t.rec.Pods {
			c.pods[p.UID] = true
		}
		for _, g := range t.gpus {
			n := needs[g.UUID]
			if g.Shared {
				n.procs = true
				tenants[g.UUID] = append(tenants[g.UUID], tenant{uid: uid, pods: c.pods, mps: g.MPS, mpsPipeDir: g.MPSPipeDir})
			} else {
				n.whole = true
			}
			needs[g.UUID] = n
		}
		snapshot = append(snapshot, c)
	}
	// Readers of GPUs no claim uses any more go, with their GPM samples.
	for uuid, r := range s.readers {
		if _, ok := needs[uuid]; !ok {
			r.free()
			delete(s.readers, uuid)
		}
	}
	s.mu.Unlock()
	s.Release(ctx, gone...)

	readings := make(map[string]*deviceReading, len(needs))
	for uuid, n := range needs {
		readings[uuid] = s.read(ctx, uuid, n)
	}
	owners := newPodOwners(s.cfg.ProcRoot)
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
	for _, c := range snapshot {
		res := result{uid: c.uid}
		for _, g := range c.gpus {
			r := readings[g.UUID]
			if r == nil {
				continue
			}
			sample := r.whole()
			if g.Shared {
				sh := shares[g.UUID][c.uid]
				sample = sh.sample(r.procUtil)
				res.unattributed += sh.unreadable
				if sh.unreadable > 0 {
					s.env.Metrics.unattributed.WithLabelValues(unattributedUnreadable).Inc()
				}
				if sh.mpsServer {
					s.env.Metrics.unattributed.WithLabelValues(unattributedMPSServer).Inc()
				}
			}
			res.samples = append(res.samples, sample)
			res.gpus = append(res.gpus, g.UUID)
		}
		results = append(results, res)
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	for _, res := range results {
		t, ok := s.claims[res.uid]
		if !ok {
			// Unprepared during the cycle.
			continue
		}
		if res.unattributed > 0 && !t.unattributed {
			t.unattributed = true
			klog.FromContext(ctx).Info("Leaving figures out of a claim's usage samples on a shared GPU: processes on the GPU whose cgroup cannot be read could be the claim's (is the plugin in the host's PID namespace?); a figure they could hide is left out rather than recorded too low, so the claim's run may be too short to merge",
				"claim", klog.KRef(t.rec.Claim.Namespace, t.rec.Claim.Name), "processes", res.unattributed, "procRoot", s.cfg.ProcRoot)
		}
		pod := ""
		if len(t.rec.Pods) > 0 {
			pod = t.rec.Pods[0].Name
		}
		for i, sample := range res.samples {
			sample.Seconds = s.interval.Seconds()
			t.rec.Run.Add(sample)
			t.dirty = true
			s.env.Metrics.set(t.rec.Claim, pod, res.gpus[i], sample)
		}
	}
}
