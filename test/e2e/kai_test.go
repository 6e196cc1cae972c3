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
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// kaiScheduler is KAI-Scheduler's default name, the default of the
// controller's --no-ladder-schedulers.
const kaiScheduler = "kai-scheduler"

// TestNoLadderForKAIPods: the claim of a pod whose schedulerName is
// kai-scheduler keeps its exactly request, with the profile's hard needs,
// and the plan, prismctl explain and an Event on the pod say why. The test
// bed's kube-scheduler, run a second time under KAI's name, stands in for
// KAI-Scheduler, which is not run: the pod is scheduled and runs.
func TestNoLadderForKAIPods(t *testing.T) {
	e := newControllerEnv(t)
	if err := e.createProfile(t, "kai-stream", prismv1alpha1.WorkloadProfileSpec{}, withPeak(memoryBound, resource.MustParse("20Gi"))); err != nil {
		t.Fatal(err)
	}
	e.profiledTemplate(t, "kai-stream", "kai-stream", gpuClaimSpec(1))
	standIn := startStandInScheduler(e.ctx, t, e.cluster, kaiScheduler)
	t.Cleanup(func() { _ = standIn.Stop(5 * time.Second) })

	pod := podWithClaim("kai-1", "kai-stream", "")
	pod.Spec.SchedulerName = kaiScheduler
	createPod(e.ctx, t, e.cluster.Client, pod)
	pod, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", "kai-1", 2*time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(e.ctx, t, e.cluster.Client, pod)
	gpu := claim.Spec.Devices.Requests[0]
	if gpu.FirstAvailable != nil || gpu.Exactly == nil || len(gpu.Exactly.Selectors) != 1 {
		t.Fatalf("gpu request %+v, want an exactly request with the hard needs as its one selector", gpu)
	}
	if needs, ok := rewrite.Conjuncts(gpu.Exactly.Selectors[0].CEL.Expression); !ok || len(needs) != 1 {
		t.Errorf("selector %q, want the memory floor from the catalogue", gpu.Exactly.Selectors[0].CEL.Expression)
	}
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(claim.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
		t.Fatalf("rewrite annotation %q: %v", claim.Annotations[rewrite.AnnotationKey], err)
	}
	const why = "kai-scheduler counts only exactly requests (NVIDIA/KAI-Scheduler#900)"
	if plan.NoLadder != why || len(plan.Alternatives) != 0 {
		t.Errorf("plan %+v, want no alternatives and noLadder %q", plan, why)
	}
	if out := e.explainClaim(t, claim.Name); !strings.Contains(out, "not written: "+why) {
		t.Errorf("explain output lacks why no ladder was written:\n%s", out)
	}
	// The claim had no name yet at admission; its pod carries the event.
	waitFor(t, "LadderNotWritten event on the pod", func() bool {
		evs, err := e.cluster.Client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "reason=LadderNotWritten,involvedObject.kind=Pod,involvedObject.name=kai-1"})
		return err == nil && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, why)
	})
	// kube-scheduler reports under its profile's name: the stand-in, not
	// the test bed's own scheduler, placed the pod.
	waitFor(t, "Scheduled event from the stand-in", func() bool {
		evs, err := e.cluster.Client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "reason=Scheduled,involvedObject.kind=Pod,involvedObject.name=kai-1"})
		return err == nil && len(evs.Items) > 0 && evs.Items[0].ReportingController == kaiScheduler
	})
}

// startStandInScheduler runs the test bed's kube-scheduler a second time,
// for the pods whose schedulerName is name only.
func startStandInScheduler(ctx context.Context, t *testing.T, c *testbed.Cluster, name string) *testbed.Process {
	t.Helper()
	dir := filepath.Join(c.WorkDir(), "run", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	config := fmt.Sprintf(`apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: %s
leaderElection:
  leaderElect: false
profiles:
- schedulerName: %s
`, c.KubeconfigPath, name)
	if err := os.WriteFile(cfg, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	p, err := testbed.StartProcess(ctx, name, dir, filepath.Join(c.WorkDir(), "logs", name+".log"), c.BinPath("kube-scheduler"), "--config="+cfg, "--secure-port=0")
	if err != nil {
		t.Fatal(err)
	}
	return p
}
