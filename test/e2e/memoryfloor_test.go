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

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// newCapacityFloorEnv is the placement bed with --memory-floor=capacity on
// whole GPUs: on a shareable GPU a capacity request is a share, not a
// floor, and the controller keeps the CEL floor. The bed publishes them
// shareable unless told otherwise.
func newCapacityFloorEnv(t *testing.T, pluginFlags ...string) *controllerEnv {
	t.Helper()
	e := newControllerEnvWith(t, func(o *bed.Options) {
		o.PluginFlags = append([]string{"--consumable-capacity=false"}, pluginFlags...)
		o.ChartSets = append(o.ChartSets, "rewrite.memoryFloor=capacity")
		o.ControllerFlags = append(o.ControllerFlags, "--memory-floor=capacity")
	})
	if e.minor < 36 {
		t.Skipf("DRAConsumableCapacity is off by default on Kubernetes 1.%d", e.minor)
	}
	e.placementProfiles(t)
	return e
}

// TestCapacityFloorPlacesAsCEL runs the placement case that needs the
// memory floor with --memory-floor=capacity, on GPUs that are not
// shareable: the fits tier asks for 39Gi of gpu.prism.dev/memory instead of
// a CEL selector, the real API server keeps the request (the controller's
// dry-run probe found that out), and the real scheduler still keeps the job
// off the L4, where it would not fit. TestProfileAwarePlacement checks the
// same case with the CEL floor.
func TestCapacityFloorPlacesAsCEL(t *testing.T) {
	e := newCapacityFloorEnv(t)

	e.waitForPlan(t, "gemm", `"memoryFloor":"capacity"`)

	e.hog(t, h100)
	got, claim := e.runPodUntilEnd(t, "gemm-1", "gemm")
	if want := placement(t, "gemm-1"); got != want {
		t.Errorf("gemm-1 got %s, want %s as with the CEL floor", got, want)
	}
	subs := claim.Spec.Devices.Requests[0].FirstAvailable
	if len(subs) == 0 {
		t.Fatalf("claim not rewritten: %+v", claim.Spec.Devices.Requests[0])
	}
	for _, sub := range subs {
		var memory string
		if sub.Capacity != nil {
			q := sub.Capacity.Requests[gpuv1alpha1.MemoryCapacity.Qualified()]
			memory = q.String()
		}
		if memory != "39Gi" {
			t.Errorf("subrequest %s: capacity %+v, want a 39Gi memory request", sub.Name, sub.Capacity)
		}
		for _, s := range sub.Selectors {
			if strings.Contains(s.CEL.Expression, "capacity") {
				t.Errorf("subrequest %s keeps a CEL memory floor: %s", sub.Name, s.CEL.Expression)
			}
		}
	}
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil || plan.MemoryFloor.Form != rewrite.FormCapacity {
		t.Errorf("claim's plan %q does not say the floor is a capacity request (%v)", claim.Annotations[rewrite.AnnotationKey], err)
	}
}

// TestTierBoundsPlaceAsCEL runs placement cases with --memory-floor=capacity
// on a plugin that publishes its figures as capacities: the fleet tiers
// become capacity requests on gpu.prism.dev/memoryBandwidthGBps and
// fp32GFLOPS, guarded by a uuid constraint, and the real API server and
// scheduler must still place each job where the CEL tiers do: the
// memory-bound job on the H100 through its bandwidth tier, and the 20 GB
// compute-bound job, with the H100s taken, on the A100 and not the L4.
func TestTierBoundsPlaceAsCEL(t *testing.T) {
	e := newCapacityFloorEnv(t, "--figures-as-capacity")
	e.waitForPlan(t, "stream", `"tierBounds":"capacity"`)

	for _, tc := range []boundCase{
		{"stream-1", "stream", "", "gpu/bandwidth-top", gpuv1alpha1.MemoryBandwidthGBpsCapacity.Qualified()},
		{"gemm-1", "gemm", h100, "gpu/fits", ""},
	} {
		// A subtest each, so that a case's pod is gone before the next
		// case takes GPUs.
		t.Run(tc.pod, func(t *testing.T) { e.checkTierBounds(t, tc) })
	}
}

// waitForPlan waits until the rewrite plan of a claim for profile holds
// fragment. The capacity forms start once the controller's probe has
// answered: watch that through dry-run claims, which the rewrite webhook
// sees too.
func (e *controllerEnv) waitForPlan(t *testing.T, profile, fragment string) {
	t.Helper()
	waitFor(t, "rewrite plans "+fragment+" for profile "+profile, func() bool {
		c, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Create(e.ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Annotations: map[string]string{"prism.dev/profile": profile}},
			Spec:       gpuClaimSpec(1),
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && strings.Contains(c.Annotations[rewrite.AnnotationKey], fragment)
	})
}

type boundCase struct {
	pod, template, hog string
	// through is the subrequest the job must be allocated through, and
	// bound the figure capacity that subrequest compares ("": none).
	through string
	bound   resourceapi.QualifiedName
}

func (e *controllerEnv) checkTierBounds(t *testing.T, tc boundCase) {
	if tc.hog != "" {
		e.hog(t, tc.hog)
	}
	got, claim := e.runPodUntilEnd(t, tc.pod, tc.template)
	if want := placement(t, tc.pod); got != want {
		t.Errorf("%s got %s, want %s as with CEL tiers", tc.pod, got, want)
	}
	if r := claim.Status.Allocation.Devices.Results[0].Request; r != tc.through {
		t.Errorf("%s allocated through %s, want %s", tc.pod, r, tc.through)
	}
	c := claim.Spec.Devices.Constraints
	if len(c) != 1 || c[0].MatchAttribute == nil || *c[0].MatchAttribute != rewrite.GuardAttribute {
		t.Errorf("%s: constraints %+v, want the uuid guard", tc.pod, c)
	}
	for _, sub := range claim.Spec.Devices.Requests[0].FirstAvailable {
		bounded := false
		if sub.Capacity != nil {
			for name := range sub.Capacity.Requests {
				bounded = bounded || name != gpuv1alpha1.MemoryCapacity.Qualified()
			}
		}
		for _, s := range sub.Selectors {
			if strings.Contains(s.CEL.Expression, ">=") && bounded {
				t.Errorf("%s: subrequest %s has a capacity bound and keeps %s", tc.pod, sub.Name, s.CEL.Expression)
			}
		}
		if sub.Name != strings.TrimPrefix(tc.through, "gpu/") || tc.bound == "" {
			continue
		}
		var requests map[resourceapi.QualifiedName]resource.Quantity
		if sub.Capacity != nil {
			requests = sub.Capacity.Requests
		}
		if _, ok := requests[tc.bound]; !ok {
			t.Errorf("%s: subrequest %s has no %s capacity request: %+v", tc.pod, sub.Name, tc.bound, sub.Capacity)
		}
	}
}
