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
	"math"
	"math/rand/v2"
	"time"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/usage"
	"github.com/prismgpu/prism/pkg/rewrite"
)

const (
	// referenceBusySeconds is the GPU time a run of a job type takes on a
	// model it runs at speed 1 on. A job type's profile stands for a
	// recurring workload that does the same work each run, which is what
	// makes busy times comparable across models; only their ratios matter.
	referenceBusySeconds = 3600
	// measureSpread is the run-to-run spread of a run's busy time, the
	// sigma of a log-normal factor: inputs, clocks and neighbours move it.
	measureSpread = 0.2
)

// outcomes are the job types' WorkloadProfile usage as the plugin's sampler
// merges it from finished runs on whole GPUs (usage.Merge), for the
// policies whose ladder reads it. A nil *outcomes measures nothing.
type outcomes struct {
	ctx   context.Context
	usage []*prismv1alpha1.UsageProfile
	rng   *rand.Rand
}

// newOutcomes starts every job type unmeasured, for the policies that
// rank by measured runs: performance and load-aware (economy keeps the top
// class free whatever the runs say).
func (e *Env) newOutcomes(r *Run) *outcomes {
	if r.Policy != PrismPerformance && r.Policy != PrismLoadAware {
		return nil
	}
	return &outcomes{ctx: e.ctx, usage: make([]*prismv1alpha1.UsageProfile, len(e.jobTypes)), rng: rand.New(rand.NewPCG(r.Seed, 0x6d656173))}
}

// finished merges a run of job type j that ran at speed on product, and
// ended at the simulated time end.
func (o *outcomes) finished(j int, speed float64, product string, end float64) {
	if o == nil {
		return
	}
	busy := referenceBusySeconds / speed * math.Exp(measureSpread*o.rng.NormFloat64())
	var run usage.Run
	for range usage.MinSamples {
		run.Add(usage.Sample{DutyCyclePercent: 100, MemoryBytes: usage.Unknown, SMActivityPercent: usage.Unknown, DRAMActivityPercent: usage.Unknown, Seconds: busy / usage.MinSamples})
	}
	at := time.Unix(int64(end), 0)
	o.usage[j] = usage.Merge(o.ctx, o.usage[j], usage.Finished{Run: run, ProductName: product, EndedAt: at})
}

// of is job type j's usage once its runs could rank a model
// (rewrite.RanksModels); nil before, when the ladder is the one NewEnv
// ranked.
func (o *outcomes) of(j int) *prismv1alpha1.UsageProfile {
	if o == nil || !rewrite.RanksModels(o.usage[j]) {
		return nil
	}
	return o.usage[j]
}
