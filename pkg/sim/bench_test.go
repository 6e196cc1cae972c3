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

package sim

import (
	"context"
	"testing"
	"time"
)

// BenchmarkSimulate10kJobs500Nodes is one `prismctl simulate` run: 10,000
// synthetic jobs, all three modes, on 500 nodes x 8 GPUs (125 nodes each
// of H100, A100 40GB, L40S and L4). An arrival every 0.7 s on average asks
// for more GPUs than are free at peaks, so queues form and completions
// trigger retry passes.
func BenchmarkSimulate10kJobs500Nodes(b *testing.B) {
	start := time.Now()
	cl := cluster(b,
		NodeGroup{Name: "h100", Product: h100, GPUsPerNode: 8, Nodes: 125},
		NodeGroup{Name: "a100", Product: a100, GPUsPerNode: 8, Nodes: 125},
		NodeGroup{Name: "l40s", Product: l40s, GPUsPerNode: 8, Nodes: 125},
		NodeGroup{Name: "l4", Product: l4, GPUsPerNode: 8, Nodes: 125})
	b.Logf("building 500 nodes: %v", time.Since(start))
	c := DefaultGenerateConfig()
	c.Jobs, c.MeanInterarrival = 10_000, 0.7
	jobs := Generate(c)
	var results []*Result
	for b.Loop() {
		var err error
		if results, err = Simulate(context.Background(), cl, jobs, AllModes, Options{Seed: 1}); err != nil {
			b.Fatal(err)
		}
	}
	calls := 0
	for _, r := range results {
		calls += r.AllocateCalls
		b.Logf("%-11s mean JCT %6.0f s  p99 %7.0f s  queue %6.0f s  util %4.1f%%  Allocate calls %d",
			r.Mode, r.MeanJCT, r.P99JCT, r.MeanQueue, 100*r.Utilisation, r.AllocateCalls)
	}
	b.ReportMetric(float64(calls), "allocate-calls/op")
}
