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

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/test/testbed"
)

// kueueCohort is two ClusterQueues of 2 GPUs each in one cohort, each able
// to borrow the other's idle quota and to reclaim its own, and to preempt
// lower priorities within itself; a LocalQueue for each, and two priorities.
const kueueCohort = `apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: low
value: 100
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: WorkloadPriorityClass
metadata:
  name: high
value: 1000
` + cohortQueue + `
  name: team-a
` + cohortQueue + `
  name: team-b
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: queue-a
  namespace: default
spec:
  clusterQueue: team-a
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: queue-b
  namespace: default
spec:
  clusterQueue: team-b
`

// cohortQueue is a ClusterQueue of the cohort but for its name, which
// follows.
const cohortQueue = `---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
spec:
  cohortName: research
  namespaceSelector: {}
  preemption:
    reclaimWithinCohort: Any
    withinClusterQueue: LowerPriority
  resourceGroups:
  - coveredResources: [cpu, memory, prism.dev/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 256Gi}
      - {name: prism.dev/gpu, nominalQuota: 2}
metadata:`

// TestKueueFairSharingPreemptsAndReleasesPrismGPUs runs a real Kueue with
// fair sharing over two ClusterQueues in a cohort, on one node of 8 Prism
// GPUs, with whole GPUs and memory shares:
//  1. team-a's low-priority Job of 3 whole GPUs borrows team-b's idle quota;
//  2. team-b's Job of 2 memory shares reclaims it: Kueue preempts team-a's
//     Job, whose claims are unprepared and deleted, and the shares run;
//  3. the preempted Job waits and is admitted again once team-b's is gone;
//  4. a high-priority Job of team-a preempts it within the queue.
//
// Through all of it no claim of a preempted pod is left prepared on the
// node: its CDI spec is gone with it.
func TestKueueFairSharingPreemptsAndReleasesPrismGPUs(t *testing.T) {
	e := newControllerEnvWith(t, func(o *bed.Options) {
		o.Nodes = []bed.NodeSpec{{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"}}
	})
	dyn := e.startKueue(t, testbed.KueueOptions{FairSharing: true}, kueueCohort)
	client := e.cluster.Client
	createTemplate(e.ctx, t, client, "whole", gpuClaimSpec(1))
	share := gpuClaimSpec(1)
	share.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse("20Gi"),
	}}
	createTemplate(e.ctx, t, client, "share", share)

	e.createJob(t, queuedJob{name: "borrower", template: "whole", queue: "queue-a", priority: "low", pods: 3})
	wl := waitForWorkload(e.ctx, t, dyn, "borrower", "Admitted", "True", "")
	if usage := podSetUsage(wl, kueueGPU); usage != "3" {
		t.Errorf("Workload of borrower charged %s=%q, want 3", kueueGPU, usage)
	}
	first := e.jobClaims(t, e.waitForJobPods(t, "borrower", 3))

	e.createJob(t, queuedJob{name: "owner", template: "share", queue: "queue-b", pods: 2})
	waitForWorkload(e.ctx, t, dyn, "owner", "Admitted", "True", "")
	wl = waitForWorkload(e.ctx, t, dyn, "borrower", "Preempted", "True", "")
	if reason := conditionOf(wl, "Preempted")["reason"]; reason != "InCohortReclamation" && reason != "InCohortFairSharing" {
		t.Errorf("borrower preempted with reason %v, want Kueue's reclaim within the cohort", reason)
	}
	for _, pod := range e.waitForJobPods(t, "owner", 2) {
		claim := podClaim(e.ctx, t, client, &pod)
		r := claim.Status.Allocation.Devices.Results[0]
		consumed := r.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]
		if r.ShareID == nil || consumed.Cmp(resource.MustParse("20Gi")) != 0 {
			t.Errorf("claim %s of owner's pod %s: allocation %+v, want a 20Gi memory share", claim.Name, pod.Name, r)
		}
	}
	e.waitReleased(t, first)

	waitForWorkload(e.ctx, t, dyn, "borrower", "QuotaReserved", "False", "")
	if err := client.BatchV1().Jobs("default").Delete(e.ctx, "owner", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	waitForWorkload(e.ctx, t, dyn, "borrower", "Admitted", "True", "")
	second := e.jobClaims(t, e.waitForJobPods(t, "borrower", 3))
	if i := slices.IndexFunc(second, func(c claimRef) bool { return slices.Contains(first, c) }); i >= 0 {
		t.Errorf("the readmitted borrower runs with claim %v of its preempted pods", second[i])
	}

	e.createJob(t, queuedJob{name: "urgent", template: "whole", queue: "queue-a", priority: "high", pods: 2})
	waitForWorkload(e.ctx, t, dyn, "urgent", "Admitted", "True", "")
	wl = waitForWorkload(e.ctx, t, dyn, "borrower", "Preempted", "True", "")
	if reason := conditionOf(wl, "Preempted")["reason"]; reason != "InClusterQueue" {
		t.Errorf("borrower preempted with reason %v, want InClusterQueue (by priority)", reason)
	}
	e.waitForJobPods(t, "urgent", 2)
	e.waitReleased(t, second)
}

// claimRef is a claim of a Job's pod, by name and UID.
type claimRef struct {
	name string
	uid  types.UID
}

func (e *controllerEnv) jobClaims(t *testing.T, pods []corev1.Pod) []claimRef {
	t.Helper()
	var out []claimRef
	for i := range pods {
		c := podClaim(e.ctx, t, e.cluster.Client, &pods[i])
		out = append(out, claimRef{c.Name, c.UID})
	}
	return out
}

// waitReleased waits until each claim is deleted and no node holds a CDI
// spec for it, which the plugin removes when it unprepares the claim.
func (e *controllerEnv) waitReleased(t *testing.T, claims []claimRef) {
	t.Helper()
	var left []string
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		left = nil
		for _, c := range claims {
			if _, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Get(ctx, c.name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				left = append(left, "claim "+c.name)
			}
			for _, n := range e.cluster.Nodes() {
				if _, err := os.Stat(filepath.Join(n.Dir, "cdi", cdi.SpecFileName(string(c.uid)))); err == nil {
					left = append(left, "CDI spec of "+c.name+" on "+n.Name)
				}
			}
		}
		return len(left) == 0, nil
	})
	if err != nil {
		t.Fatalf("claims of preempted pods not released: %v: %v", left, err)
	}
}
