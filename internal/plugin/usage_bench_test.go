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
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// BenchmarkUsageSampling is the cost of the usage profile on an 8-GPU node
// with every GPU prepared: one op is one sampling cycle (every
// DefaultUsageInterval), with the records persisted every sixth cycle as
// every 30 s. "off" is the same node with sampling off, which runs no
// cycle at all; cpu-%-of-a-core is the cycle's time over the interval, the
// share of one core sampling costs. The simulated NVML reads its usage
// file on every call, so this overstates the real library's cost, which
// is an ioctl per call.
//
//	go test ./internal/plugin -run '^$' -bench UsageSampling -benchmem
func BenchmarkUsageSampling(b *testing.B) {
	for _, tc := range []struct {
		name     string
		sampling bool
		shared   bool
	}{{"off", false, false}, {"exclusive-8", true, false}, {"shared-8x2", true, true}} {
		b.Run(tc.name, func(b *testing.B) {
			dir := b.TempDir()
			usageFile := filepath.Join(dir, "usage.json")
			procRoot := filepath.Join(dir, "proc")
			d := newTestDriverWith(b, "h100-sxm-8.yaml", dir, func(c *Config) {
				if !tc.sampling {
					return
				}
				c.Usage = &sampler.Config{NVML: simulatedNVML(b, "h100-sxm-8.yaml", usageFile), ProcRoot: procRoot}
			})
			bed := &usageBed{dir: dir, usageFile: usageFile, procRoot: procRoot}
			var gpus []nvml.GPUUsage
			for i := range 8 {
				g := nvml.GPUUsage{Index: i, UtilizationPercent: 50, MemoryUsedBytes: 10 << 30, SMActivityPercent: 40}
				device := fmt.Sprintf("gpu-%d", i)
				if tc.shared {
					// Two claims share each GPU, one process each.
					for j, uid := range []string{fmt.Sprintf("a%d", i), fmt.Sprintf("b%d", i)} {
						pid := uint32(1000 + 2*i + j)
						bed.process(b, fmt.Sprint(pid), podUID(types.UID(uid)))
						g.Processes = append(g.Processes, nvml.ProcessUsage{PID: pid, UtilizationPercent: 20, MemoryUsedBytes: 4 << 30})
						c := profiledClaim(sharedClaim(uid, "20Gi"), "bench")
						c.Status.Allocation.Devices.Results[0].Device = device
						if res := prepare(b, d, c)[c.UID]; res.Err != nil {
							b.Fatal(res.Err)
						}
					}
				} else {
					uid := fmt.Sprintf("a%d", i)
					if res := prepare(b, d, profiledClaim(allocatedClaim(uid, []string{device}), "bench"))[types.UID(uid)]; res.Err != nil {
						b.Fatal(res.Err)
					}
				}
				gpus = append(gpus, g)
			}
			bed.use(b, gpus...)
			ctx := context.Background()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				if d.state.usage == nil {
					continue
				}
				d.state.usage.Sample(ctx)
				if i%6 == 0 {
					d.state.usage.Persist(ctx)
				}
			}
			perCycle := time.Since(start) / time.Duration(max(b.N, 1))
			b.ReportMetric(float64(perCycle)/float64(DefaultUsageInterval)*100, "cpu-%-of-a-core")
		})
	}
}
