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
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestPartitionSizedByMeasuredUse runs MIG sizing end to end on a node
// with two H100s in MIG mode (the MIGPartitions gate):
//
//   - a light profiled job (p95 duty cycle 5 %, peak 3Gi: SizeShare gives
//     15 % compute and 5Gi) is rewritten to [mig-1g20gb, fits], since the
//     1g.10gb has 16 of 132 SMs (12 %) and the 1g.20gb 26 (20 %), and the
//     scheduler gives it a 1g.20gb partition;
//   - a heavy one (p95 95 %) keeps its claim and gets a whole GPU.
func TestPartitionSizedByMeasuredUse(t *testing.T) {
	e := newControllerEnvWith(t, func(o *bed.Options) {
		// NodeSpec.Fleet is joined to demo/fleets; the MIG fleet is this
		// test's own.
		o.Nodes = []bed.NodeSpec{{Name: "gpu-mig", Fleet: "../../test/e2e/testdata/h100-mig-2.yaml", MIGPartitions: true}}
	})
	if e.minor < 36 {
		t.Skipf("DRAPartitionableDevices is off by default on Kubernetes 1.%d", e.minor)
	}
	never := prismv1alpha1.WorkloadProfileSpec{DisableAutoProfiling: true}
	e.createUsageProfile(t, "light", never, &prismv1alpha1.UsageProfile{
		Runs: 3, Samples: 600, DutyCycleP50MilliPercent: milli(2000), DutyCycleP95MilliPercent: milli(5000),
		PeakMemory: ptrQuantity(3 * gi), ProductName: "NVIDIA H100 80GB HBM3",
	})
	e.createUsageProfile(t, "heavy", never, &prismv1alpha1.UsageProfile{
		Runs: 3, Samples: 600, DutyCycleP50MilliPercent: milli(90000), DutyCycleP95MilliPercent: milli(95000),
		PeakMemory: ptrQuantity(30 * gi), ProductName: "NVIDIA H100 80GB HBM3",
	})
	for _, name := range []string{"light", "heavy"} {
		e.profiledTemplate(t, name, name, gpuClaimSpec(1))
	}

	// The controller sizes from the partitions its fleet view has seen: a
	// dry-run claim shows when it has.
	probe := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: "default", Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: "light"}},
		Spec:       gpuClaimSpec(1),
	}
	waitFor(t, "the controller sees the partitions", func() bool {
		got, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Create(e.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && partitionPlan(t, got).Verdict == rewrite.PartitionSized.String()
	})

	_, light := e.runPod(t, "light-1", "light")
	plan := partitionPlan(t, light)
	if plan.Verdict != rewrite.PartitionSized.String() || len(plan.Profiles) != 1 || plan.Profiles[0] != "1g.20gb" {
		t.Errorf("light job's partition plan %+v; want 1g.20gb sized from its usage", plan)
	}
	r := light.Status.Allocation.Devices.Results[0]
	if r.Request != "gpu/mig-1g20gb" || !strings.Contains(r.Device, "-mig-1g20gb-") {
		t.Errorf("light job allocated %s through %s; want a 1g.20gb partition through gpu/mig-1g20gb", r.Device, r.Request)
	}
	dev := allocatedDevice(e.ctx, t, e.cluster.Client, light)
	if got := stringAttr(dev, string(gpuv1alpha1.MIGProfileAttribute)); got != "1g.20gb" {
		t.Errorf("light job's device publishes migProfile %q, want 1g.20gb", got)
	}

	_, heavy := e.runPod(t, "heavy-1", "heavy")
	r = heavy.Status.Allocation.Devices.Results[0]
	if r.Request != "gpu" || strings.Contains(r.Device, "-mig-") {
		t.Errorf("heavy job allocated %s through %s; want a whole GPU through the request as written", r.Device, r.Request)
	}
	if _, rewritten := heavy.Annotations[rewrite.AnnotationKey]; rewritten {
		t.Errorf("heavy job's claim was rewritten: %s", heavy.Annotations[rewrite.AnnotationKey])
	}
	for _, pod := range []string{"light-1", "heavy-1"} {
		deletePod(e.ctx, t, e.cluster, pod)
	}
}

// partitionPlan is the partition step of the claim's rewrite plan; zero
// where it has none.
func partitionPlan(t *testing.T, claim *resourceapi.ResourceClaim) rewrite.PartitionPlan {
	t.Helper()
	return ptr.Deref(claimPlan(t, claim).Partition, rewrite.PartitionPlan{})
}
