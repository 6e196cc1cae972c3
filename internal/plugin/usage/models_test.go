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

package usage

import (
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-40GB"
)

// busyRun is four samples at duty per cent, each standing for seconds.
func busyRun(duty int, seconds float64) Run {
	var r Run
	for range 4 {
		r.Add(Sample{DutyCyclePercent: duty, MemoryBytes: Unknown, SMActivityPercent: Unknown, DRAMActivityPercent: Unknown, Seconds: seconds})
	}
	return r
}

func TestBusyTimeIsKeptPerModel(t *testing.T) {
	steps := []struct {
		name string
		run  Finished
		want []prismv1alpha1.ModelUsage
	}{{
		name: "first run on an H100: 4 samples of 50 s at 50 %",
		run:  Finished{Run: busyRun(50, 50), ProductName: h100},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 1, BusyMilliseconds: 100_000}},
	}, {
		name: "second H100 run, 60 s busy: the mean counts it one half",
		run:  Finished{Run: busyRun(30, 50), ProductName: h100},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 2, BusyMilliseconds: 80_000}},
	}, {
		name: "a run on a share of an A100 says nothing of the A100",
		run:  Finished{Run: busyRun(90, 50), ProductName: a100, Share: &gpuv1alpha1.Share{ComputePercent: 40}},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 2, BusyMilliseconds: 80_000}},
	}, {
		name: "a whole A100 is a model of its own",
		run:  Finished{Run: busyRun(100, 50), ProductName: a100},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 2, BusyMilliseconds: 80_000}, {ProductName: a100, Runs: 1, BusyMilliseconds: 200_000}},
	}, {
		name: "a run under Nsight Compute says nothing of the model: its kernels were replayed",
		run:  Finished{Run: busyRun(100, 500), ProductName: h100, Profiled: true},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 2, BusyMilliseconds: 80_000}, {ProductName: a100, Runs: 1, BusyMilliseconds: 200_000}},
	}, {
		name: "a record from a plugin that kept no busy time changes nothing",
		run:  Finished{Run: run(gi, Unknown, 50, 50, 50), ProductName: h100},
		want: []prismv1alpha1.ModelUsage{{ProductName: h100, Runs: 2, BusyMilliseconds: 80_000}, {ProductName: a100, Runs: 1, BusyMilliseconds: 200_000}},
	}}
	var profile *prismv1alpha1.UsageProfile
	for _, s := range steps {
		profile = Merge(t.Context(), profile, s.run)
		if diff := cmp.Diff(s.want, profile.Models); diff != "" {
			t.Errorf("%s (-want +got):\n%s", s.name, diff)
		}
	}
}

func TestAModelPastTheBoundReplacesTheLeastRun(t *testing.T) {
	prev := &prismv1alpha1.UsageProfile{Runs: MaxModels}
	for i := range MaxModels {
		// Model 3 has the fewest runs.
		runs := int32(5)
		if i == 3 {
			runs = 1
		}
		prev.Models = append(prev.Models, prismv1alpha1.ModelUsage{ProductName: fmt.Sprintf("model %d", i), Runs: runs, BusyMilliseconds: 1000})
	}
	got := Merge(t.Context(), prev, Finished{Run: busyRun(100, 1), ProductName: "new"})
	if len(got.Models) != MaxModels {
		t.Fatalf("%d models kept, want %d", len(got.Models), MaxModels)
	}
	for _, m := range got.Models {
		if m.ProductName == "model 3" {
			t.Errorf("the model with the fewest runs was kept: %+v", got.Models)
		}
	}
	if last := got.Models[MaxModels-1]; last.ProductName != "new" || last.BusyMilliseconds != 4000 {
		t.Errorf("the new model is %+v, want new with 4000 ms", last)
	}
}
