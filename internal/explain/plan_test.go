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

package explain

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPlanNotes(t *testing.T) {
	for _, tc := range []struct {
		name, annotation string
		want             []PlanNote
	}{
		{"load-aware plan",
			`{"profile":"p","boundType":"MemoryBound","policy":"load-aware","fleet":"memoryBandwidthGBps: H100 3350 x8 | 3150 | A100 1555 x8","load":"yields H100: 8 devices of multi-GPU claims pending, 7 free","alternatives":[{"name":"bandwidth-yield","reason":"memoryBandwidthGBps < 3150 GB/s: 1 of 2 models"},{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "MemoryBound under the load-aware policy"},
				{"Fleet", "memoryBandwidthGBps: H100 3350 x8 | 3150 | A100 1555 x8"},
				{"Load", "yields H100: 8 devices of multi-GPU claims pending, 7 free"},
				{"Tier", "bandwidth-yield: memoryBandwidthGBps < 3150 GB/s: 1 of 2 models"},
				{"Tier", "fits: hard needs only"},
			}},
		{"plan of the built-in ladders", `{"profile":"p","boundType":"LatencyBound","policy":"economy","alternatives":[{"name":"low","reason":"smallest cards"}]}`,
			[]PlanNote{{"Rewrite", "LatencyBound under the economy policy"}, {"Tier", "low: smallest cards"}}},
		{"affinity plan: the preference is on the pod",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","preference":{"mode":"affinity","reason":"every model that holds the workload is on single-model nodes","terms":[{"weight":100,"tier":"bandwidth-top","models":["NVIDIA H100 80GB HBM3"]}]},"alternatives":[{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "MemoryBound under the performance policy"},
				{"Preference", "affinity: every model that holds the workload is on single-model nodes"},
				{"Node term", "gpu.prism.dev/model In [NVIDIA-H100-80GB-HBM3], weight 100 (tier bandwidth-top)"},
				{"Tier", "fits: hard needs only"},
			}},
		{"affinity plan with a memory floor: the nodes below it are excluded",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","preference":{"mode":"affinity","reason":"every model that holds the workload is on single-model nodes","terms":[{"weight":100,"tier":"bandwidth-top","models":["NVIDIA H100 80GB HBM3"]}],"exclude":["NVIDIA L4"]},"alternatives":[{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "MemoryBound under the performance policy"},
				{"Preference", "affinity: every model that holds the workload is on single-model nodes"},
				{"Node term", "gpu.prism.dev/model In [NVIDIA-H100-80GB-HBM3], weight 100 (tier bandwidth-top)"},
				{"Excluded", "gpu.prism.dev/model NotIn [NVIDIA-L4]: below the memory floor; a required term on the pod"},
				{"Tier", "fits: hard needs only"},
			}},
		{"capacity forms asked for: what each need became, and why not",
			`{"profile":"p","boundType":"ComputeBound","policy":"economy","memoryFloor":"capacity","tierBounds":"cel: no tier of this ladder is a lower bound on a figure","alternatives":[{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "ComputeBound under the economy policy"},
				{"Memory floor", "capacity"},
				{"Tier bounds", "cel: no tier of this ladder is a lower bound on a figure"},
				{"Tier", "fits: hard needs only"},
			}},
		{"the controller's decision on capacity requests, then what each need became",
			`{"profile":"p","boundType":"ComputeBound","policy":"economy","capacity":"capacity: the API server keeps capacity requests, and --memory-floor=capacity","memoryFloor":"cel: 4 GPUs are published shareable, where a capacity request is a share, not a floor","alternatives":[{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "ComputeBound under the economy policy"},
				{"Capacity requests", "capacity: the API server keeps capacity requests, and --memory-floor=capacity"},
				{"Memory floor", "cel: 4 GPUs are published shareable, where a capacity request is a share, not a floor"},
				{"Tier", "fits: hard needs only"},
			}},
		{"no ladder for the pod's scheduler: the hard needs in the exactly request",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","hardNeeds":"memory>=39Gi","capacity":"capacity: the API server keeps capacity requests, and --memory-floor=capacity","memoryFloor":"cel: kai-scheduler allocates without checking capacity requests","noLadder":"kai-scheduler counts only exactly requests (NVIDIA/KAI-Scheduler#900)","rewritten":["gpu"]}`,
			[]PlanNote{
				{"Rewrite", "gpu as MemoryBound under the performance policy"},
				{"Ladder", "not written: kai-scheduler counts only exactly requests (NVIDIA/KAI-Scheduler#900)"},
				{"Hard needs", "memory>=39Gi"},
				{"Capacity requests", "capacity: the API server keeps capacity requests, and --memory-floor=capacity"},
				{"Memory floor", "cel: kai-scheduler allocates without checking capacity requests"},
			}},
		{"capacity requests dropped by the API server",
			`{"profile":"p","boundType":"ComputeBound","policy":"economy","capacity":"cel: the API server drops capacity requests (DRAConsumableCapacity is off)","alternatives":[{"name":"fits","reason":"hard needs only"}]}`,
			[]PlanNote{
				{"Rewrite", "ComputeBound under the economy policy"},
				{"Capacity requests", "cel: the API server drops capacity requests (DRAConsumableCapacity is off)"},
				{"Tier", "fits: hard needs only"},
			}},
		// What only the JSON used to show: the requests rewritten, the hard
		// needs, the requests left alone, and that the lists were cut.
		{"requests rewritten and left alone, cut to fit",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","hardNeeds":"memory>=39Gi","alternatives":[{"name":"fits","reason":"hard needs only"}],"rewritten":["gpu","gpu-2"],"untouched":[{"request":"nic","reason":"device class nic.example.com is not gpu.prism.dev"}],"truncated":true}`,
			[]PlanNote{
				{"Rewrite", "gpu, gpu-2 as MemoryBound under the performance policy"},
				{"Hard needs", "memory>=39Gi"},
				{"Tier", "fits: hard needs only"},
				{"Untouched", "nic: device class nic.example.com is not gpu.prism.dev"},
				{"Note", "the plan was cut short to fit the annotation; the lists above are incomplete"},
			}},
		{"a share first, sized from the measured use",
			`{"profile":"p","boundType":"Unknown","policy":"performance","share":{"verdict":"sized","computePercent":45,"memory":"8Gi","usage":"duty cycle p50 20% p95 32%, peak memory 6Gi, 3 runs","reason":"compute 45% from a p95 duty cycle of 32%; memory 8Gi from a peak of 6Gi","requests":["gpu"],"whole":[{"request":"pair","reason":"asks for more than one GPU; a share is a part of one"}]},"alternatives":[{"name":"share","reason":"45% compute, 8Gi memory of a shareable GPU"},{"name":"fits","reason":"hard needs only"}],"rewritten":["gpu","pair"]}`,
			[]PlanNote{
				{"Rewrite", "gpu, pair as Unknown under the performance policy"},
				{"Usage", "duty cycle p50 20% p95 32%, peak memory 6Gi, 3 runs"},
				{"Share", "45% compute, 8Gi memory first, for gpu: compute 45% from a p95 duty cycle of 32%; memory 8Gi from a peak of 6Gi"},
				{"Whole GPU", "pair: asks for more than one GPU; a share is a part of one"},
				{"Tier", "share: 45% compute, 8Gi memory of a shareable GPU"},
				{"Tier", "fits: hard needs only"},
			}},
		{"no share, and why",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","share":{"verdict":"heavy","usage":"duty cycle p95 90%, peak memory 60Gi, 1 run","reason":"compute 100% from a p95 duty cycle of 90%; 80% or more of a GPU keeps a whole one"},"alternatives":[{"name":"fits","reason":"hard needs only"}],"rewritten":["gpu"]}`,
			[]PlanNote{
				{"Rewrite", "gpu as MemoryBound under the performance policy"},
				{"Usage", "duty cycle p95 90%, peak memory 60Gi, 1 run"},
				{"Share", "none, heavy: compute 100% from a p95 duty cycle of 90%; 80% or more of a GPU keeps a whole one"},
				{"Tier", "fits: hard needs only"},
			}},
		{"a MIG partition first, sized from the measured use",
			`{"profile":"p","boundType":"Unknown","policy":"performance","partition":{"verdict":"sized","profiles":["1g.20gb"],"computePercent":15,"memoryBytes":5368709120,"usage":"duty cycle p50 2.5% p95 5%, peak memory 3Gi, 3 runs","reason":"compute 15% from a p95 duty cycle of 5%; memory 5Gi from a peak of 3Gi; smallest fitting: 1g.20gb on NVIDIA H100 80GB HBM3 (26 of 132 SMs, 20096Mi)","requests":["gpu"],"whole":[{"request":"pair","reason":"asks for more than one GPU; a partition is a part of one"}]},"alternatives":[{"name":"mig-1g20gb","reason":"MIG partition 1g.20gb, the smallest published that holds 15% compute and 5Gi memory"},{"name":"fits","reason":"hard needs only: never less schedulable than the plain claim"}],"rewritten":["gpu"],"untouched":[{"request":"pair","reason":"keeps a whole GPU (asks for more than one GPU; a partition is a part of one), and the profile prefers none"}]}`,
			[]PlanNote{
				{"Rewrite", "gpu as Unknown under the performance policy"},
				{"Usage", "duty cycle p50 2.5% p95 5%, peak memory 3Gi, 3 runs"},
				{"Partition", "1g.20gb first, for gpu: compute 15% from a p95 duty cycle of 5%; memory 5Gi from a peak of 3Gi; smallest fitting: 1g.20gb on NVIDIA H100 80GB HBM3 (26 of 132 SMs, 20096Mi)"},
				{"Whole GPU", "pair: asks for more than one GPU; a partition is a part of one"},
				{"Tier", "mig-1g20gb: MIG partition 1g.20gb, the smallest published that holds 15% compute and 5Gi memory"},
				{"Tier", "fits: hard needs only: never less schedulable than the plain claim"},
				{"Untouched", "pair: keeps a whole GPU (asks for more than one GPU; a partition is a part of one), and the profile prefers none"},
			}},
		{"no partition, and why",
			`{"profile":"p","boundType":"MemoryBound","policy":"performance","partition":{"verdict":"heavy","usage":"duty cycle p95 90%, 1 run","reason":"compute 100% from a p95 duty cycle of 90%; 80% or more of a GPU keeps a whole one"},"alternatives":[{"name":"fits","reason":"hard needs only"}],"rewritten":["gpu"]}`,
			[]PlanNote{
				{"Rewrite", "gpu as MemoryBound under the performance policy"},
				{"Usage", "duty cycle p95 90%, 1 run"},
				{"Partition", "none, heavy: compute 100% from a p95 duty cycle of 90%; 80% or more of a GPU keeps a whole one"},
				{"Tier", "fits: hard needs only"},
			}},
		{"profiling note", `{"profile":"p","action":"profile","reason":"profile not found"}`,
			[]PlanNote{{"Rewrite", "none, this run is profiled instead: profile not found"}}},
		{"not JSON: given as it is", `{`, []PlanNote{{"Rewrite", "{"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, PlanNotes(tc.annotation)); diff != "" {
				t.Errorf("PlanNotes (-want +got):\n%s", diff)
			}
		})
	}
}
