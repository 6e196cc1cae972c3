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
	"fmt"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// kueueGPU is the resource name Kueue gives quota for; every Prism
// DeviceClass a template may name is mapped onto it.
const kueueGPU = "prism.dev/gpu"

var kueuePrismClasses = []string{"gpu.prism.dev", "rewrite.gpu.prism.dev", "low.gpu.prism.dev", "mid.gpu.prism.dev", "high.gpu.prism.dev", "ultra.gpu.prism.dev"}

// kueueQueues is a ClusterQueue with 2 GPUs of quota and a LocalQueue for
// the default namespace.
const kueueQueues = `apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: default-flavor
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: gpus
spec:
  namespaceSelector: {}
  resourceGroups:
  - coveredResources: [cpu, memory, prism.dev/gpu]
    flavors:
    - name: default-flavor
      resources:
      - {name: cpu, nominalQuota: "64"}
      - {name: memory, nominalQuota: 256Gi}
      - {name: prism.dev/gpu, nominalQuota: 2}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: LocalQueue
metadata:
  name: team
  namespace: default
spec:
  clusterQueue: gpus
`

// TestKueueAdmitsAProfiledJob: a real Kueue counts a profiled Job's GPUs
// from its ResourceClaimTemplate against a ClusterQueue's quota and admits
// it; only then are its claims made, Prism rewrites them from the profile,
// and the pods land on the GPUs the profile asks for. A second Job over the
// quota waits, suspended, until the first is gone.
func TestKueueAdmitsAProfiledJob(t *testing.T) {
	e := newControllerEnvWith(t, func(o *bed.Options) {
		o.Nodes = []bed.NodeSpec{{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"}, {Name: "gpu-l4", Fleet: "l4-4.yaml"}}
	})
	dyn := e.startKueue(t, testbed.KueueOptions{}, kueueQueues)
	// Memory-bound: the H100 has the higher memory bandwidth. The template
	// is the plain one Kueue can count; the profile is in the metadata of
	// the claims made from it.
	if err := e.createProfile(t, "stream", prismv1alpha1.WorkloadProfileSpec{}, memoryBound); err != nil {
		t.Fatal(err)
	}
	e.profiledTemplate(t, "stream", "stream", gpuClaimSpec(1))

	created := e.createQueuedJob(t, "train-a", 2)
	if !ptr.Deref(created.Spec.Suspend, false) {
		t.Errorf("Job train-a was created unsuspended: Kueue's webhook did not take it")
	}
	wl := waitForWorkload(e.ctx, t, dyn, "train-a", "Admitted", "True", "")
	if usage := podSetUsage(wl, kueueGPU); usage != "2" {
		t.Errorf("Workload of train-a charged %s=%q, want 2 (2 pods × 1 GPU from the template)", kueueGPU, usage)
	}

	admitted := conditionTime(t, wl, "Admitted")
	pods := e.waitForJobPods(t, "train-a", 2)
	for _, pod := range pods {
		if pod.Spec.NodeName != "gpu-h100" {
			t.Errorf("pod %s of the memory-bound Job runs on %s, want gpu-h100", pod.Name, pod.Spec.NodeName)
		}
		claim := podClaim(e.ctx, t, e.cluster.Client, &pod)
		if claim.Annotations[rewrite.AnnotationKey] == "" {
			t.Errorf("claim %s of pod %s carries no %s annotation: Prism did not rewrite it", claim.Name, pod.Name, rewrite.AnnotationKey)
		}
		// Conditions have one-second resolution.
		if claim.CreationTimestamp.Time.Before(admitted) {
			t.Errorf("claim %s was made at %s, before Kueue admitted the Job at %s", claim.Name, claim.CreationTimestamp, admitted)
		}
		if got := stringAttr(allocatedDevice(e.ctx, t, e.cluster.Client, claim), "productName"); got != h100 {
			t.Errorf("pod %s got a %s, want a %s", pod.Name, got, h100)
		}
	}

	t.Run("a template with a CEL selector is inadmissible", func(t *testing.T) {
		e.profiledTemplate(t, "stream-h100", "stream", gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].productName == "`+h100+`"`))
		job := e.createQueuedJobFrom(t, "pinned", "stream-h100", 1)
		defer func() {
			_ = e.cluster.Client.BatchV1().Jobs("default").Delete(e.ctx, job.Name, metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)})
		}()
		wl := waitForWorkload(e.ctx, t, dyn, "pinned", "QuotaReserved", "False", "Inadmissible")
		if cond := conditionOf(wl, "QuotaReserved"); cond["reason"] != "Inadmissible" || !strings.Contains(fmt.Sprint(cond["message"]), "CEL selectors are not supported") {
			t.Errorf("Workload of a Job whose template has a selector: QuotaReserved %v, want reason Inadmissible with Kueue's CEL message", cond)
		}
	})

	t.Run("a Job over the quota waits until the first is gone", func(t *testing.T) {
		created := e.createQueuedJob(t, "train-b", 1)
		if !ptr.Deref(created.Spec.Suspend, false) {
			t.Errorf("Job train-b was created unsuspended")
		}
		wl := waitForWorkload(e.ctx, t, dyn, "train-b", "QuotaReserved", "False", "Pending")
		if msg := conditionMessage(wl, "QuotaReserved"); !strings.Contains(msg, "insufficient unused quota for "+kueueGPU) {
			t.Errorf("Workload of train-b: QuotaReserved message %q, want Kueue's insufficient quota for %s", msg, kueueGPU)
		}
		job, err := e.cluster.Client.BatchV1().Jobs("default").Get(e.ctx, "train-b", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !ptr.Deref(job.Spec.Suspend, false) {
			t.Errorf("Job train-b runs over the quota")
		}
		if err := e.cluster.Client.BatchV1().Jobs("default").Delete(e.ctx, "train-a", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
			t.Fatal(err)
		}
		waitForWorkload(e.ctx, t, dyn, "train-b", "Admitted", "True", "")
		for _, pod := range e.waitForJobPods(t, "train-b", 1) {
			if pod.Spec.NodeName != "gpu-h100" {
				t.Errorf("pod %s of train-b runs on %s, want gpu-h100", pod.Name, pod.Spec.NodeName)
			}
		}
	})
}

// startKueue starts Kueue with Prism's classes counted as kueueGPU and the
// options, creates the queues of the manifest, and returns a client for
// Kueue's Workloads.
func (e *controllerEnv) startKueue(t *testing.T, opts testbed.KueueOptions, queues string) dynamic.Interface {
	t.Helper()
	opts.DeviceClassMappings = map[string][]string{kueueGPU: kueuePrismClasses}
	if _, err := e.cluster.StartKueue(e.ctx, opts); err != nil {
		t.Fatal(err)
	}
	if out, err := testbed.Kubectl(e.ctx, e.cluster, "apply", "-f", writeTempFile(t, "queues.yaml", []byte(queues))); err != nil {
		t.Fatalf("create Kueue's queues: %v\n%s", err, out)
	}
	dyn, err := dynamic.NewForConfig(e.cluster.Config)
	if err != nil {
		t.Fatal(err)
	}
	return dyn
}

// createQueuedJob creates a Job in the LocalQueue team whose pods each use
// one claim from the template stream, and returns it as admitted.
func (e *controllerEnv) createQueuedJob(t *testing.T, name string, pods int32) *batchv1.Job {
	t.Helper()
	return e.createQueuedJobFrom(t, name, "stream", pods)
}

// createQueuedJobFrom is createQueuedJob with another template.
func (e *controllerEnv) createQueuedJobFrom(t *testing.T, name, template string, pods int32) *batchv1.Job {
	t.Helper()
	return e.createJob(t, queuedJob{name: name, template: template, queue: "team", pods: pods})
}

// queuedJob is a Job for a Kueue LocalQueue whose pods each use one claim
// from template; priority, unless empty, names a WorkloadPriorityClass.
type queuedJob struct {
	name, template, queue, priority string
	pods                            int32
}

func (e *controllerEnv) createJob(t *testing.T, j queuedJob) *batchv1.Job {
	t.Helper()
	name, template, pods := j.name, j.template, j.pods
	labels := map[string]string{testbed.KueueQueueNameLabel: j.queue}
	if j.priority != "" {
		labels[testbed.KueuePriorityClassLabel] = j.priority
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", Labels: labels},
		Spec: batchv1.JobSpec{
			Parallelism: ptr.To(pods), Completions: ptr.To(pods),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				HostNetwork:                   true,
				RestartPolicy:                 corev1.RestartPolicyNever,
				TerminationGracePeriodSeconds: ptr.To[int64](0),
				ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
				Containers: []corev1.Container{{
					Name: "cuda", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}},
				}},
			}},
		},
	}
	created, err := e.cluster.Client.BatchV1().Jobs("default").Create(e.ctx, job, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Job %s: %v", name, err)
	}
	return created
}

// waitForJobPods waits for n running pods of the Job and returns them.
func (e *controllerEnv) waitForJobPods(t *testing.T, job string, n int) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := e.cluster.Client.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
		if err != nil {
			return false, err
		}
		pods, last = nil, ""
		for _, p := range list.Items {
			last += fmt.Sprintf(" %s:%s", p.Name, p.Status.Phase)
			if p.Status.Phase == corev1.PodRunning && p.DeletionTimestamp == nil {
				pods = append(pods, p)
			}
		}
		return len(pods) == n, nil
	})
	if err != nil {
		j, _ := e.cluster.Client.BatchV1().Jobs("default").Get(e.ctx, job, metav1.GetOptions{})
		suspended := j != nil && ptr.Deref(j.Spec.Suspend, false)
		t.Fatalf("Job %s: want %d running pods, have%s (suspended %v): %v", job, n, last, suspended, err)
	}
	return pods
}

// waitForWorkload waits until the Workload Kueue made for the Job has the
// condition with the status and, unless empty, the reason; it returns it.
func waitForWorkload(ctx context.Context, t *testing.T, dyn dynamic.Interface, job, condition, status, reason string) *unstructured.Unstructured {
	t.Helper()
	var wl *unstructured.Unstructured
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := dyn.Resource(testbed.KueueWorkloads).Namespace("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for i := range list.Items {
			for _, ref := range list.Items[i].GetOwnerReferences() {
				if ref.Kind == "Job" && ref.Name == job {
					wl = &list.Items[i]
					got := conditionOf(wl, condition)
					return got["status"] == status && (reason == "" || got["reason"] == reason), nil
				}
			}
		}
		return false, nil
	})
	if err != nil {
		if wl == nil {
			t.Fatalf("Kueue made no Workload for Job %s: %v", job, err)
		}
		conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
		t.Fatalf("Workload %s of Job %s: want %s=%s %s, conditions %v: %v", wl.GetName(), job, condition, status, reason, conds, err)
	}
	return wl
}

func conditionOf(wl *unstructured.Unstructured, name string) map[string]any {
	conds, _, _ := unstructured.NestedSlice(wl.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == name {
			return m
		}
	}
	return nil
}

// conditionTime is when the condition last changed.
func conditionTime(t *testing.T, wl *unstructured.Unstructured, name string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339, fmt.Sprint(conditionOf(wl, name)["lastTransitionTime"]))
	if err != nil {
		t.Fatalf("Workload %s: %s condition time: %v", wl.GetName(), name, err)
	}
	return at
}

func conditionMessage(wl *unstructured.Unstructured, name string) string {
	s, _ := conditionOf(wl, name)["message"].(string)
	return s
}

// podSetUsage is what the Workload's admission charges its first pod set
// for the resource.
func podSetUsage(wl *unstructured.Unstructured, resource string) string {
	sets, _, _ := unstructured.NestedSlice(wl.Object, "status", "admission", "podSetAssignments")
	if len(sets) == 0 {
		return ""
	}
	set, _ := sets[0].(map[string]any)
	usage, _, _ := unstructured.NestedStringMap(set, "resourceUsage")
	return usage[resource]
}
