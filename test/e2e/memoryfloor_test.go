package e2e

import (
	"encoding/json"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestCapacityFloorPlacesAsCEL runs the placement case that needs the
// memory floor with --memory-floor=capacity, on GPUs that are not
// shareable: the fits tier asks for 39Gi of gpu.prism.dev/memory instead of
// a CEL selector, the real API server keeps the request (the controller's
// dry-run probe found that out), and the real scheduler still keeps the job
// off the L4, where it would not fit. TestProfileAwarePlacement checks the
// same case with the CEL floor.
func TestCapacityFloorPlacesAsCEL(t *testing.T) {
	e := newControllerEnvWith(t, func(o *bed.Options) {
		// Whole GPUs only: on a shareable GPU a capacity request is a
		// share, not a floor, and the controller keeps the CEL floor. The
		// bed publishes them shareable unless told otherwise.
		o.PluginFlags = []string{"--consumable-capacity=false"}
		o.ChartSets = append(o.ChartSets, "rewrite.memoryFloor=capacity")
		o.ControllerFlags = append(o.ControllerFlags, "--memory-floor=capacity")
	})
	if e.minor < 36 {
		t.Skipf("DRAConsumableCapacity is off by default on Kubernetes 1.%d", e.minor)
	}
	e.placementProfiles(t)

	// Claims get the capacity floor once the probe has answered: watch it
	// through dry-run claims, which the rewrite webhook sees too.
	waitFor(t, "rewrite writes the memory floor as a capacity request", func() bool {
		c, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Create(e.ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Annotations: map[string]string{"prism.dev/profile": "gemm"}},
			Spec:       gpuClaimSpec(1),
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && strings.Contains(c.Annotations[rewrite.AnnotationKey], `"memoryFloor":"capacity"`)
	})

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
			q := sub.Capacity.Requests[rewrite.MemoryCapacity]
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
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil || plan.MemoryFloor != rewrite.MemoryFloorCapacity {
		t.Errorf("claim's plan %q does not say the floor is a capacity request (%v)", claim.Annotations[rewrite.AnnotationKey], err)
	}
}
