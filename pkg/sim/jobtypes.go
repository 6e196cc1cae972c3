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
	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// JobType is one of the training workloads whose throughput Gavel measured
// (see throughput.go). SMPct and MemPct are what an Nsight Compute
// speed-of-light section would report for it on a V100-class GPU, in
// percent of peak: the classifier's input.
//
// These two figures are estimates from each model's architecture and batch
// size (what dominates its kernels: large convolutions and GEMMs keep the
// SMs busy, LSTMs at small batch and wide sparse layers stream weights,
// tiny networks and batch-1 steps are launch-bound). They were written and
// committed before the throughput matrix was read, so no throughput figure
// went into them; docs/simulator.md states the dependence that remains.
type JobType struct {
	Name          string
	SMPct, MemPct float64
}

// JobTypes are Gavel's single-worker job types, named as Gavel names them
// (CycleGAN runs at batch size 1, A3C at 4).
var JobTypes = []JobType{
	{"ResNet-18 (batch size 16)", 35, 30},
	{"ResNet-18 (batch size 32)", 45, 35},
	{"ResNet-18 (batch size 64)", 60, 45},
	{"ResNet-18 (batch size 128)", 70, 50},
	{"ResNet-18 (batch size 256)", 78, 55},
	{"ResNet-50 (batch size 16)", 70, 50},
	{"ResNet-50 (batch size 32)", 78, 52},
	{"ResNet-50 (batch size 64)", 84, 55},
	{"ResNet-50 (batch size 128)", 86, 56},
	{"Transformer (batch size 16)", 50, 45},
	{"Transformer (batch size 32)", 60, 55},
	{"Transformer (batch size 64)", 68, 58},
	{"Transformer (batch size 128)", 72, 60},
	{"Transformer (batch size 256)", 75, 62},
	{"LM (batch size 5)", 25, 55},
	{"LM (batch size 10)", 30, 62},
	{"LM (batch size 20)", 35, 70},
	{"LM (batch size 40)", 45, 75},
	{"LM (batch size 80)", 55, 78},
	{"Recommendation (batch size 512)", 40, 65},
	{"Recommendation (batch size 1024)", 45, 70},
	{"Recommendation (batch size 2048)", 50, 74},
	{"Recommendation (batch size 4096)", 55, 78},
	{"Recommendation (batch size 8192)", 58, 80},
	{"CycleGAN", 55, 72},
	{"A3C", 10, 8},
}

// Bound is what Prism's classifier (profile.Classify, the code the
// profiling path runs) makes of the job type's measurements.
func (t JobType) Bound() v1alpha1.BoundType {
	return profile.Classify(int32(t.SMPct*1000), int32(t.MemPct*1000))
}
