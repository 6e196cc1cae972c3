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
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// TestLoadAwareYieldsToPendingMultiGPU: on the bed's fleet (8 H100, 8 A100,
// 4 L4), a single-GPU memory-bound job with policy load-aware takes an
// H100 while nobody waits, and an A100 while an 8-GPU claim waits for the
// H100 node, which it would otherwise break up.
func TestLoadAwareYieldsToPendingMultiGPU(t *testing.T) {
	e := newControllerEnv(t)
	const h100, a100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"
	status := prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeMemoryBound, SMThroughputMilliPercent: milli(20000), MemoryThroughputMilliPercent: milli(91000)}
	if err := e.createProfile(t, "stream-la", prismv1alpha1.WorkloadProfileSpec{Policy: prismv1alpha1.PolicyLoadAware}, status); err != nil {
		t.Fatal(err)
	}
	e.profiledTemplate(t, "stream-la", "stream-la", gpuClaimSpec(1))
	onH100 := `device.attributes["gpu.prism.dev"].productName == "` + h100 + `"`
	e.profiledTemplate(t, "one-h100", "", gpuClaimSpec(1, onH100))
	e.profiledTemplate(t, "eight-h100", "", gpuClaimSpec(8, onH100))

	t.Run("nobody waits: takes an H100", func(t *testing.T) {
		got, claim := e.runPodUntilEnd(t, "stream-la-0", "stream-la")
		if got != h100 {
			t.Errorf("got %s, want %s", got, h100)
		}
		if plan := loadDecision(t, claim); !strings.HasPrefix(plan, "takes") {
			t.Errorf("load decision %q, want takes", plan)
		}
	})

	// One H100 held, and an 8-GPU claim waiting for the H100 node.
	createPod(e.ctx, t, e.cluster.Client, podWithClaim("hog-one", "one-h100", ""))
	if _, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", "hog-one", time.Minute, testbed.PodRunning); err != nil {
		t.Fatal(err)
	}
	createPod(e.ctx, t, e.cluster.Client, podWithClaim("wants-eight", "eight-h100", ""))
	t.Cleanup(func() {
		deletePod(e.ctx, t, e.cluster, "wants-eight")
		deletePod(e.ctx, t, e.cluster, "hog-one")
	})
	waitFor(t, "the controller to see the 8-GPU claim pending", func() bool {
		return strings.HasPrefix(e.dryRunLoadDecision(t, "stream-la"), "yields")
	})

	t.Run("an 8-GPU claim waits for the H100s: the single GPU goes to an A100", func(t *testing.T) {
		got, claim := e.runPodUntilEnd(t, "stream-la-1", "stream-la")
		if got != a100 {
			t.Errorf("got %s, want %s", got, a100)
		}
		decision := loadDecision(t, claim)
		if !strings.Contains(decision, "8 devices of multi-GPU claims pending") {
			t.Errorf("load decision %q does not name the pending claim and the free H100s", decision)
		}
		if r := claim.Status.Allocation.Devices.Results[0].Request; r != "gpu/bandwidth-yield" {
			t.Errorf("allocated through %s, want gpu/bandwidth-yield", r)
		}
		out := e.explainClaim(t, claim.Name)
		if !strings.Contains(out, "\nLoad:     yields NVIDIA H100 80GB HBM3: 8 devices of multi-GPU claims pending") || !strings.Contains(out, "* gpu/bandwidth-yield") {
			t.Errorf("explain output does not show the load decision and the yield tier:\n%s", out)
		}
	})

	pending, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, "wants-eight", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pending.Spec.NodeName != "" || pending.Status.Phase != corev1.PodPending {
		t.Errorf("the 8-GPU pod was scheduled to %q while an H100 was held", pending.Spec.NodeName)
	}
}

func loadDecision(t *testing.T, claim *resourceapi.ResourceClaim) string {
	t.Helper()
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
		t.Fatalf("rewrite annotation of %s: %v", claim.Name, err)
	}
	return plan.Load
}

// dryRunLoadDecision admits a claim for the profile without storing it and
// returns what the load-aware policy decided.
func (e *controllerEnv) dryRunLoadDecision(t *testing.T, profile string) string {
	plan, _ := e.dryRunPlan(profile)
	return plan.Load
}
