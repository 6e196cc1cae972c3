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

package rewrite

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// exactlyOnly writes the claim of a pod whose scheduler counts a claim's
// GPUs only from its exactly requests. KAI-Scheduler at commit
// 72de64fc8eca10fa8cca26a20156178f3edbe092 and at v0.17.0 (docs/kai.md):
//
//   - pkg/common/resources/dra.go, countGPUDevicesFromClaim, counts Count
//     GPUs for an exactly request of a class whose name holds "gpu" and
//     nothing for a firstAvailable one, so a ladder would be charged no
//     GPU against the queue's quota or the node's GPUs (the TODO in
//     pkg/scheduler/api/node_info/node_info.go, setAcceptedResources;
//     NVIDIA/KAI-Scheduler#900);
//   - run beside Prism by hack/kai-check.sh, neither runs a pod whose
//     claim has a ladder: v0.17.0's scheduler refuses it ("has
//     subrequests, but the DRAPrioritizedList feature is disabled"), the
//     older one places it and its binder fails ("empty status for claim
//     gpu in bind request") for ever. Both give a share a whole GPU and
//     record no consumed capacity (the older one only with its
//     DRAConsumableCapacity gate on; it refuses capacity requests
//     otherwise).
//
// So the claim gets no ladder, no share or partition ahead of one (Rewrite
// offers neither), and no capacity request: each eligible request keeps its
// exactly form, which KAI counts as whole GPUs, and gets only the hard
// needs as one CEL selector ahead of the user's. Every tier of its
// whole-GPU ladder would have held them: a GPU they rule out could not
// hold the workload.
func (w *claimRewrite) exactlyOnly() error {
	generated, err := tierSelectors([]tier{fits}, w.n)
	if err != nil {
		return err
	}
	var expr string
	if len(generated[0]) > 0 {
		if expr, err = joined(generated[0]); err != nil {
			return err
		}
	}
	for i := range w.out.Devices.Requests {
		req := &w.out.Devices.Requests[i]
		if reason := ineligible(req, generated); reason != "" {
			w.plan.Untouched = append(w.plan.Untouched, Untouched{Request: req.Name, Reason: reason})
			continue
		}
		w.plan.NoLadder = fmt.Sprintf("%s counts only exactly requests (NVIDIA/KAI-Scheduler#900)", w.cluster.ExactlyOnly)
		if expr == "" {
			w.plan.Untouched = append(w.plan.Untouched, Untouched{Request: req.Name, Reason: "no ladder, and the profile has no hard needs to add"})
			continue
		}
		req.Exactly.Selectors = append([]resourceapi.DeviceSelector{selector(expr)}, req.Exactly.Selectors...)
		w.plan.Rewritten = append(w.plan.Rewritten, req.Name)
	}
	if len(w.plan.Rewritten) > 0 && w.cluster.Capacity.MemoryFloor && w.n.floor != nil {
		w.plan.MemoryFloor = celBecause("%s allocates without checking capacity requests", w.cluster.ExactlyOnly)
	}
	return nil
}
