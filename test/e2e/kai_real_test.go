//go:build kai

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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// This file runs only under the kai build tag, from hack/kai-check.sh: the
// module proxy refuses KAI-Scheduler's module, so KAI is built from its
// public source outside this repository and run here as processes.

// KAI-Scheduler's names for a pod's queue and group, as its pods carry
// them (pkg/common/constants in its source).
const (
	kaiQueueLabel         = "kai.scheduler/queue"
	kaiPodGroupAnnotation = "pod-group-name"
	// kaiNode has eight GPUs of four models (demo/fleets/mixed.yaml):
	// two H100 80GB and two A100 80GB hold 40Gi, two L4 and two T4 do not.
	kaiNode = "gpu-mixed"
)

// kaiQueues is a parent queue of the node's 8 GPUs with two children of 4
// each. Either child may use what the other leaves idle (limit -1, equal
// over-quota weights) and gets its quota back by reclaim.
var kaiQueues = kaiQueue("research", "", 8) + "---\n" + kaiQueue("team-a", "research", 4) + "---\n" + kaiQueue("team-b", "research", 4)

// kaiQueue is a KAI Queue with a GPU quota and no limit on CPU or memory.
func kaiQueue(name, parent string, gpus int) string {
	return fmt.Sprintf(`apiVersion: scheduling.run.ai/v2
kind: Queue
metadata:
  name: %s
spec:
  parentQueue: %q
  resources:
    gpu: {quota: %d, limit: -1, overQuotaWeight: 1}
    cpu: {quota: -1, limit: -1, overQuotaWeight: 1}
    memory: {quota: -1, limit: -1, overQuotaWeight: 1}
`, name, parent, gpus)
}

// kaiEnv is the controller environment with KAI-Scheduler's scheduler,
// binder, queue controller and pod-group controller beside Prism.
type kaiEnv struct {
	*controllerEnv
	stateDir string
}

// newKAIEnv starts the test bed with one node of eight GPUs of four
// models, Prism with the stand-in MPS, and KAI. configure, when not nil,
// changes the bed's options; gates, when not empty, are Kubernetes feature
// gates for KAI's scheduler and binder (--feature-gates).
func newKAIEnv(t *testing.T, configure func(*bed.Options), gates string) *kaiEnv {
	src, bin := os.Getenv("PRISM_KAI_SOURCE"), os.Getenv("PRISM_KAI_BIN")
	if src == "" || bin == "" {
		t.Fatal("PRISM_KAI_SOURCE and PRISM_KAI_BIN are unset: run this through hack/kai-check.sh")
	}
	crds := append(bed.CRDDirs(repoRoot), filepath.Join(src, "deployments", "kai-scheduler", "crds"))
	mpsBin := buildStandIn(t, "fake-mps-control", "nvidia-cuda-mps-control")
	ctx, cluster := testbed.ForTest(t, testbed.Options{CRDDirs: crds})
	opts := bed.Options{RepoRoot: repoRoot, PluginBin: pluginBinary, ControllerBin: controllerBinary,
		PluginFlags: []string{"--consumable-capacity"}, MPSControl: mpsBin,
		Nodes: []bed.NodeSpec{{Name: kaiNode, Fleet: "mixed.yaml"}}}
	if configure != nil {
		configure(&opts)
	}
	b, err := bed.Setup(ctx, cluster, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	e := &kaiEnv{
		controllerEnv: &controllerEnv{ctx: ctx, cluster: cluster, prism: prismClient(t, cluster), minor: serverMinor(t, cluster), bed: b},
		stateDir:      b.StateDirs[opts.Nodes[0].Name],
	}
	e.startKAI(t, bin, gates)
	e.apply(t, "queues.yaml", kaiQueues)
	for name, value := range map[string]int32{"kai-low": 50, "kai-high": 200} {
		pc := &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: name}, Value: value}
		if _, err := cluster.Client.SchedulingV1().PriorityClasses().Create(ctx, pc, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// startKAI runs KAI's components as its chart would, each on its own
// loopback ports, with its webhooks off (they need a serving certificate
// and only validate KAI's own objects).
func (e *kaiEnv) startKAI(t *testing.T, bin, gates string) {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kai-scheduler"}}
	if _, err := e.cluster.Client.CoreV1().Namespaces().Create(e.ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	components := map[string][]string{
		"scheduler":          {"--listen-address=127.0.0.1:18080", "--plugin-server-port=18081", "--schedule-period=1s"},
		"binder":             {"--metrics-bind-address=127.0.0.1:18082", "--health-probe-bind-address=127.0.0.1:18083"},
		"queuecontroller":    {"--enable-webhook=false", "--metrics-listen-address=127.0.0.1:18084"},
		"podgroupcontroller": {"--enable-podgroup-webhook=false", "--metrics-bind-address=127.0.0.1:18085", "--health-probe-bind-address=127.0.0.1:18086"},
	}
	if gates != "" {
		components["scheduler"] = append(components["scheduler"], "--feature-gates="+gates)
		components["binder"] = append(components["binder"], "--feature-gates="+gates)
	}
	for name, args := range components {
		dir := filepath.Join(e.cluster.WorkDir(), "run", "kai-"+name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p, err := testbed.StartProcessWithEnv(e.ctx, "kai-"+name, dir, filepath.Join(e.cluster.WorkDir(), "logs", "kai-"+name+".log"),
			[]string{"KUBECONFIG=" + e.cluster.KubeconfigPath}, filepath.Join(bin, name), args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(5 * time.Second) })
	}
}

func (e *kaiEnv) apply(t *testing.T, name, manifest string) {
	t.Helper()
	if out, err := testbed.Kubectl(e.ctx, e.cluster, "apply", "-f", writeTempFile(t, name, []byte(manifest))); err != nil {
		t.Fatalf("apply %s: %v\n%s", name, err, out)
	}
}

// kaiJob is one KAI PodGroup in a queue and its pods, each with one claim
// from template.
type kaiJob struct {
	name, template, queue, priority string
	preemptible                     bool
	pods, minMember                 int
}

// submit creates the job's PodGroup, then its pods, named name-0, name-1…
func (e *kaiEnv) submit(t *testing.T, j kaiJob) []string {
	t.Helper()
	preemptibility := "non-preemptible"
	if j.preemptible {
		preemptibility = "preemptible"
	}
	e.apply(t, j.name+"-podgroup.yaml", fmt.Sprintf(`apiVersion: scheduling.run.ai/v2alpha2
kind: PodGroup
metadata:
  name: %s
  namespace: default
  labels: {%s: %s}
spec:
  queue: %s
  minMember: %d
  priorityClassName: %s
  preemptibility: %s
  markUnschedulable: true
`, j.name, kaiQueueLabel, j.queue, j.queue, max(j.minMember, 1), j.priority, preemptibility))
	var names []string
	for i := range j.pods {
		name := fmt.Sprintf("%s-%d", j.name, i)
		pod := hostNetworkPod(podWithClaim(name, j.template, ""))
		pod.Spec.SchedulerName = kaiScheduler
		pod.Spec.PriorityClassName = j.priority
		pod.Labels = map[string]string{kaiQueueLabel: j.queue}
		pod.Annotations = map[string]string{kaiPodGroupAnnotation: j.name}
		createPod(e.ctx, t, e.cluster.Client, pod)
		names = append(names, name)
	}
	return names
}

// running waits until every named pod runs and returns their claims.
func (e *kaiEnv) running(t *testing.T, names ...string) []claimRef {
	t.Helper()
	var claims []claimRef
	for _, name := range names {
		pod, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", name, 3*time.Minute, testbed.PodRunning)
		if err != nil {
			t.Fatalf("%v; %s", err, e.story(t, name))
		}
		claim := podClaim(e.ctx, t, e.cluster.Client, pod)
		if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Driver != gpuv1alpha1.DriverName {
			t.Fatalf("claim %s of running pod %s: allocation %+v, want one %s device", claim.Name, name, a, gpuv1alpha1.DriverName)
		}
		claims = append(claims, claimRef{claim.Name, claim.UID})
	}
	return claims
}

// story is what KAI and the kubelet said about a pod, for failures.
func (e *kaiEnv) story(t *testing.T, name string) string {
	t.Helper()
	pod, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	return schedulingStory(e.ctx, t, e.cluster.Client, pod)
}

// livePods are the pods of the named jobs that exist and are not being
// deleted, sorted.
func (e *kaiEnv) livePods(t *testing.T, jobs ...string) []string {
	t.Helper()
	pods, err := e.cluster.Client.CoreV1().Pods("default").List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range pods.Items {
		if p.DeletionTimestamp == nil && slices.Contains(jobs, p.Annotations[kaiPodGroupAnnotation]) {
			out = append(out, p.Name)
		}
	}
	slices.Sort(out)
	return out
}

// waitEvicted waits until exactly want of the named pods are gone, and
// returns the claims of those that went.
func (e *kaiEnv) waitEvicted(t *testing.T, claims map[string]claimRef, want int) []claimRef {
	t.Helper()
	var gone []claimRef
	err := wait.PollUntilContextTimeout(e.ctx, 500*time.Millisecond, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		gone = nil
		for name, c := range claims {
			p, err := e.cluster.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil) {
				gone = append(gone, c)
			}
		}
		return len(gone) >= want, nil
	})
	if err != nil {
		t.Fatalf("%d of %d pods evicted, want %d: %v", len(gone), len(claims), want, err)
	}
	if len(gone) != want {
		t.Errorf("%d pods evicted, want %d: %v", len(gone), want, gone)
	}
	return gone
}

// checkpointHolds asserts that the plugin's checkpoint holds exactly the
// claims of the running pods: nothing of an evicted pod stays prepared.
func (e *kaiEnv) checkpointHolds(t *testing.T, pods ...string) {
	t.Helper()
	var want []string
	for _, c := range e.running(t, pods...) {
		want = append(want, string(c.uid))
	}
	slices.Sort(want)
	var got []string
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		got = preparedClaims(t, e.stateDir)
		return slices.Equal(got, want), nil
	})
	if err != nil {
		t.Fatalf("the checkpoint holds claims %v, want only the running pods' %v: %v", got, want, err)
	}
}

// staysPending asserts that for d none of the named pods is bound and
// none of their claims is allocated.
func (e *kaiEnv) staysPending(t *testing.T, d time.Duration, names ...string) {
	t.Helper()
	deadline := time.Now().Add(d)
	err := wait.PollUntilContextTimeout(e.ctx, 500*time.Millisecond, d+10*time.Second, true, func(ctx context.Context) (bool, error) {
		for _, name := range names {
			pod, err := e.cluster.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			if pod.Spec.NodeName != "" {
				return false, fmt.Errorf("%s was bound to %s: %s", name, pod.Spec.NodeName, e.story(t, name))
			}
			if claim := memberClaim(ctx, t, e.cluster.Client, pod); claim != nil && claim.Status.Allocation != nil {
				return false, fmt.Errorf("claim %s of %s was allocated", claim.Name, name)
			}
		}
		return time.Now().After(deadline), nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		t.Logf("%s, pending: %s", name, e.story(t, name))
	}
}

// queueGPUs is the queue's allocated GPUs as KAI's queue controller
// reports them: under the name of the claims' DeviceClass, not
// nvidia.com/gpu.
func (e *kaiEnv) queueGPUs(t *testing.T, queue string) string {
	t.Helper()
	out, err := testbed.Kubectl(e.ctx, e.cluster, "get", "queues.scheduling.run.ai", queue, "-o", `jsonpath={.status.allocated.gpu\.prism\.dev}`)
	if err != nil {
		t.Fatalf("read queue %s: %v\n%s", queue, err, out)
	}
	return strings.TrimSpace(out)
}

// waitQueueGPUs waits until KAI reports want GPUs allocated to queue.
func (e *kaiEnv) waitQueueGPUs(t *testing.T, queue, want string) {
	t.Helper()
	var got string
	err := wait.PollUntilContextTimeout(e.ctx, time.Second, time.Minute, true, func(context.Context) (bool, error) {
		got = e.queueGPUs(t, queue)
		return got == want, nil
	})
	if err != nil {
		t.Errorf("queue %s allocated gpu.prism.dev=%q, want %q", queue, got, want)
	}
}

// deletePods deletes the named pods; their claims go with them.
func (e *kaiEnv) deletePods(t *testing.T, pods ...string) {
	t.Helper()
	for _, p := range pods {
		deletePod(e.ctx, t, e.cluster, p)
	}
}

// TestKAISchedulerQueuesPrismGPUs runs a real KAI-Scheduler, built from its
// source by hack/kai-check.sh, over one node of eight Prism GPUs:
//  1. team-a's preemptible jobs borrow team-b's idle quota;
//  2. team-b's jobs reclaim it: KAI evicts two of team-a's pods, whose
//     claims are unprepared and deleted;
//  3. a high-priority job of team-a preempts one of its own low ones;
//  4. a gang of two waits, with nothing allocated or prepared, while one
//     GPU is free, and starts whole when a second frees up;
//  5. a profiled job gets its exactly request with the hard needs, and KAI
//     places it only on a GPU that holds them.
//
// After each step the plugin's checkpoint holds the running pods' claims
// and nothing else.
func TestKAISchedulerQueuesPrismGPUs(t *testing.T) {
	e := newKAIEnv(t, nil, "")
	createTemplate(e.ctx, t, e.cluster.Client, "whole", gpuClaimSpec(1))

	var borrowers []string
	borrowed := map[string]claimRef{}
	t.Run("a queue over its quota borrows idle GPUs", func(t *testing.T) {
		for i := range 6 {
			borrowers = append(borrowers, e.submit(t, kaiJob{name: fmt.Sprintf("borrower%d", i), template: "whole", queue: "team-a", priority: "kai-low", preemptible: true, pods: 1})...)
		}
		claims := e.running(t, borrowers...)
		for i, name := range borrowers {
			borrowed[name] = claims[i]
		}
		e.waitQueueGPUs(t, "team-a", "6")
		e.checkpointHolds(t, borrowers...)
	})

	var owners []string
	t.Run("the lending queue reclaims its quota", func(t *testing.T) {
		for i := range 4 {
			owners = append(owners, e.submit(t, kaiJob{name: fmt.Sprintf("owner%d", i), template: "whole", queue: "team-b", priority: "kai-low", preemptible: true, pods: 1})...)
		}
		e.running(t, owners...)
		e.waitReleased(t, e.waitEvicted(t, borrowed, 2))
		e.waitQueueGPUs(t, "team-a", "4")
		e.waitQueueGPUs(t, "team-b", "4")
		e.checkpointHolds(t, append(e.livePods(t, jobsOf(borrowers)...), owners...)...)
	})

	var urgent []string
	t.Run("a higher priority preempts within its queue", func(t *testing.T) {
		left := map[string]claimRef{}
		for _, name := range e.livePods(t, jobsOf(borrowers)...) {
			left[name] = borrowed[name]
		}
		urgent = e.submit(t, kaiJob{name: "urgent", template: "whole", queue: "team-a", priority: "kai-high", pods: 1})
		e.running(t, urgent...)
		e.waitReleased(t, e.waitEvicted(t, left, 1))
		e.checkpointHolds(t, slices.Concat(e.livePods(t, jobsOf(borrowers)...), owners, urgent)...)
	})

	t.Run("a gang starts whole or not at all", func(t *testing.T) {
		e.deletePods(t, owners[0])
		gang := e.submit(t, kaiJob{name: "gang", template: "whole", queue: "team-b", priority: "kai-low", preemptible: true, pods: 2, minMember: 2})
		holding := slices.Concat(e.livePods(t, jobsOf(borrowers)...), owners[1:], urgent)
		// One GPU is free: the gang does not fit.
		e.staysPending(t, 20*time.Second, gang...)
		e.checkpointHolds(t, holding...)
		e.deletePods(t, owners[1])
		e.running(t, gang...)
		e.checkpointHolds(t, slices.Concat(e.livePods(t, jobsOf(borrowers)...), owners[2:], urgent, gang)...)
		e.deletePods(t, slices.Concat(e.livePods(t, jobsOf(borrowers)...), owners[2:], urgent, gang)...)
	})

	t.Run("a profiled job lands where its hard needs hold", func(t *testing.T) {
		if err := e.createProfile(t, "big-stream", prismv1alpha1.WorkloadProfileSpec{}, withPeak(memoryBound, resource.MustParse("40Gi"))); err != nil {
			t.Fatal(err)
		}
		e.profiledTemplate(t, "big-stream", "big-stream", gpuClaimSpec(1))
		// Hold the four GPUs of 80 GB: only L4s and T4s stay free.
		var pins []string
		for _, model := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe"} {
			tmpl := "pin-" + strings.Fields(model)[1]
			createTemplate(e.ctx, t, e.cluster.Client, strings.ToLower(tmpl), gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].productName == "`+model+`"`))
			for i := range 2 {
				pins = append(pins, e.submit(t, kaiJob{name: fmt.Sprintf("%s%d", strings.ToLower(tmpl), i), template: strings.ToLower(tmpl), queue: "team-a", priority: "kai-low", pods: 1})...)
			}
		}
		e.running(t, pins...)
		job := e.submit(t, kaiJob{name: "profiled", template: "big-stream", queue: "team-b", priority: "kai-low", pods: 1})
		plain := e.submit(t, kaiJob{name: "plain", template: "whole", queue: "team-b", priority: "kai-low", pods: 1})
		e.running(t, plain...)
		// Only L4s and T4s are free: none holds the 40Gi floor.
		e.staysPending(t, 10*time.Second, job...)
		e.deletePods(t, pins[2])
		claims := e.running(t, job...)
		claim, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Get(e.ctx, claims[0].name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := stringAttr(allocatedDevice(e.ctx, t, e.cluster.Client, claim), "productName"); got != "NVIDIA A100 80GB PCIe" {
			t.Errorf("the profiled pod got a %q, want the A100 80GB freed for it", got)
		}
		gpu := claim.Spec.Devices.Requests[0]
		if gpu.FirstAvailable != nil || gpu.Exactly == nil || len(gpu.Exactly.Selectors) != 1 {
			t.Errorf("gpu request %+v, want an exactly request with the hard needs as its one selector", gpu)
		}
		if plan := claimPlan(t, claim); plan.NoLadder == "" {
			t.Errorf("plan %+v, want why no ladder was written", plan)
		}
		e.deletePods(t, slices.Concat(pins[:2], pins[3:], job, plain)...)
	})
}

// kaiForm is a form of claim that Prism or a user may write, and what KAI
// was seen to do with it: whether its pods run and, where they do not, a
// phrase of what KAI says on the pod.
type kaiForm struct {
	name     string
	template resourceapi.ResourceClaimSpec
	// refusals are what KAI releases were seen to say when they refuse
	// the form: its pods stay Pending, with one of these on each.
	refusals []string
	// wholeGPUs: KAI releases were seen to run the form, each claim on a
	// device of its own, with no share ID and no consumed capacity in its
	// allocation, and counted as one GPU against the queue.
	wholeGPUs bool
}

// ladderClaim is a firstAvailable ladder, H100 first, as Prism writes one.
func ladderClaim() resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "h100", DeviceClassName: gpuv1alpha1.DriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.attributes["gpu.prism.dev"].productName == "NVIDIA H100 80GB HBM3"`}}}},
			{Name: "any", DeviceClassName: gpuv1alpha1.DriverName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
		},
	}}}}
}

// shareClaim is a 20Gi memory share of one GPU, a capacity request.
func shareClaim() resourceapi.ResourceClaimSpec {
	share := gpuClaimSpec(1)
	share.Devices.Requests[0].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
		gpuv1alpha1.MemoryCapacity.Qualified(): resource.MustParse("20Gi"),
	}}
	return share
}

// TestKAIWithPrismClaimForms: what KAI, as it runs by default, does with a
// firstAvailable ladder and with a memory share. Each form's two pods run
// alone in team-b on an empty node.
func TestKAIWithPrismClaimForms(t *testing.T) {
	e := newKAIEnv(t, nil, "")
	for _, f := range []kaiForm{
		{name: "ladder", template: ladderClaim(), refusals: []string{
			// v0.13: the scheduler allocates a subrequest, and the binder
			// finds no allocation for the request and retries for ever.
			"empty status for claim gpu in bind request",
			// v0.17: the scheduler's allocator runs without the feature.
			"has subrequests, but the DRAPrioritizedList feature is disabled",
		}},
		// v0.13 refuses a share; v0.17 gives it a whole GPU.
		{name: "share", template: shareClaim(), wholeGPUs: true,
			refusals: []string{"has capacity requests, but the DRAConsumableCapacity feature is disabled"}},
	} {
		t.Run(f.name, func(t *testing.T) { e.tryForm(t, f) })
	}
}

// TestKAISharesWithConsumableCapacity: KAI's scheduler and binder with
// Kubernetes' DRAConsumableCapacity gate on, and two memory shares.
func TestKAISharesWithConsumableCapacity(t *testing.T) {
	e := newKAIEnv(t, nil, "DRAConsumableCapacity=true")
	// KAI then allocates each share a GPU of its own and writes neither a
	// share ID nor the consumed capacity: a share is a whole GPU, and
	// counted as one against the queue.
	e.tryForm(t, kaiForm{name: "share", template: shareClaim(), wholeGPUs: true})
}

// tryForm submits two pods of one group with the form's claims in team-b,
// waits until both run or 45 s pass, logs what happened, and checks it
// against what the form says. Then it deletes them and checks that the
// plugin holds nothing of theirs: no prepared claim, CDI spec or MPS
// daemon.
func (e *kaiEnv) tryForm(t *testing.T, f kaiForm) {
	t.Helper()
	createTemplate(e.ctx, t, e.cluster.Client, f.name, f.template)
	pods := e.submit(t, kaiJob{name: f.name, template: f.name, queue: "team-b", priority: "kai-low", preemptible: true, pods: 2})
	deadline := time.Now().Add(45 * time.Second)
	_ = wait.PollUntilContextTimeout(e.ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		return len(e.runningOf(t, pods)) == len(pods) || time.Now().After(deadline), nil
	})
	var outcome, stories []string
	devices := map[string]bool{}
	for _, name := range pods {
		pod, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		line := fmt.Sprintf("%s: phase %s node %q", name, pod.Status.Phase, pod.Spec.NodeName)
		if claim := memberClaim(e.ctx, t, e.cluster.Client, pod); claim != nil && claim.Status.Allocation != nil {
			for _, r := range claim.Status.Allocation.Devices.Results {
				line += fmt.Sprintf("; allocated %s/%s request %s share %v consumed %v", r.Pool, r.Device, r.Request, r.ShareID != nil, r.ConsumedCapacity)
				if f.wholeGPUs && (devices[r.Device] || r.ShareID != nil || len(r.ConsumedCapacity) > 0) {
					t.Errorf("%s: allocated %s/%s share ID %v consumed %v, want a device of its own with neither", name, r.Pool, r.Device, r.ShareID, r.ConsumedCapacity)
				}
				devices[r.Device] = true
			}
		}
		story := e.story(t, name)
		stories = append(stories, story)
		outcome = append(outcome, line+"; "+story)
	}
	gpus := e.queueGPUs(t, "team-b")
	t.Logf("KAI with a %s: team-b allocated gpu.prism.dev=%q\n%s", f.name, gpus, strings.Join(outcome, "\n"))

	running := e.runningOf(t, pods)
	switch {
	case len(running) == len(pods) && f.wholeGPUs:
		t.Logf("KAI ran the %s, a whole GPU each", f.name)
		e.waitQueueGPUs(t, "team-b", fmt.Sprint(len(pods)))
	case len(running) == 0 && len(f.refusals) > 0:
		for i, story := range stories {
			if !slices.ContainsFunc(f.refusals, func(r string) bool { return strings.Contains(story, r) }) {
				t.Errorf("%s: KAI says %q, want one of %q", pods[i], story, f.refusals)
			}
		}
	default:
		t.Errorf("%d of %d pods with a %s run; KAI was seen to refuse it (%q) or, where whole GPUs are allowed (%v), to run it all", len(running), len(pods), f.name, f.refusals, f.wholeGPUs)
	}
	if prepared := preparedClaims(t, e.stateDir); len(prepared) != len(running) {
		t.Errorf("%d pods run and %d claims are prepared, want one each", len(running), len(prepared))
	}
	e.deletePods(t, pods...)
	waitFor(t, "nothing prepared", func() bool { return len(preparedClaims(t, e.stateDir)) == 0 })
	waitFor(t, "no CDI spec left", func() bool {
		specs, _ := filepath.Glob(filepath.Join(filepath.Dir(e.stateDir), "cdi", cdi.SpecFileName("*")))
		return len(specs) == 0
	})
	waitFor(t, "no MPS daemon left", func() bool {
		procs, err := bed.MPSProcesses(e.stateDir)
		return err == nil && len(procs) == 0
	})
}

// TestKAIWithAffinityForm: with --preference=affinity the pod webhook
// adds node affinity to a profiled pod of KAI's: a required term that keeps
// it off the L4 node, whose 24 GB is under the compute-bound job's 39Gi
// floor, and a preference for the H100 node. Its claim keeps an exactly
// request with the floor (as with the ladder preference: KAI cannot run a
// firstAvailable one). The A100 node holds one pod, so that the job's
// preference (the empty H100 node) and KAI's bin-packing (the fuller A100
// node) disagree: where the pod lands says whether KAI follows the
// preference. (The A100 node also comes first by name, so the test does
// not tell bin-packing from node order.)
func TestKAIWithAffinityForm(t *testing.T) {
	nodes := map[string]string{"gpu-h100": h100, "gpu-a100": a100, "gpu-l4": l4}
	e := newKAIEnv(t, func(o *bed.Options) {
		o.Nodes = []bed.NodeSpec{{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"}, {Name: "gpu-a100", Fleet: "a100-40gb-8.yaml"}, {Name: "gpu-l4", Fleet: "l4-4.yaml"}}
		o.ChartSets = append(o.ChartSets, "rewrite.preference="+string(rewrite.PreferAffinity))
		o.ControllerFlags = append(o.ControllerFlags, "--preference="+string(rewrite.PreferAffinity))
	}, "")
	for node, model := range nodes {
		waitFor(t, "label "+rewrite.ModelLabel+" on "+node, func() bool {
			n, err := e.cluster.Client.CoreV1().Nodes().Get(e.ctx, node, metav1.GetOptions{})
			return err == nil && n.Labels[rewrite.ModelLabel] == rewrite.ModelLabelValue(model)
		})
	}
	e.placementProfiles(t)
	waitFor(t, "pod webhook sees template gemm", func() bool {
		pod, err := e.cluster.Client.CoreV1().Pods("default").Create(e.ctx, podWithClaim("probe", "gemm", ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(preferredTerms(pod)) > 0
	})
	// kube-scheduler places the filler: KAI cannot take it back.
	createTemplate(e.ctx, t, e.cluster.Client, "one-a100", gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].productName == "`+a100+`"`))
	createPod(e.ctx, t, e.cluster.Client, hostNetworkPod(podWithClaim("a100-filler", "one-a100", "")))
	if _, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", "a100-filler", time.Minute, testbed.PodRunning); err != nil {
		t.Fatal(err)
	}

	job := e.submit(t, kaiJob{name: "gemm-kai", template: "gemm", queue: "team-a", priority: "kai-low", preemptible: true, pods: 1})
	claims := e.running(t, job...)
	pod, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, job[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Get(e.ctx, claims[0].name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("KAI placed the affinity form on %s; pod affinity %+v; claim requests %+v; plan %s",
		pod.Spec.NodeName, pod.Spec.Affinity, claim.Spec.Devices.Requests, claim.Annotations[rewrite.AnnotationKey])
	if len(preferredTerms(pod)) == 0 {
		t.Errorf("the pod has no preferred node affinity: %+v", pod.Spec.Affinity)
	}
	if gpu := claim.Spec.Devices.Requests[0]; gpu.FirstAvailable != nil || gpu.Exactly == nil {
		t.Errorf("gpu request %+v, want an exactly request: KAI cannot run a firstAvailable one", gpu)
	}
	if pod.Spec.NodeName != kaiAffinityLanding {
		t.Errorf("the pod runs on %s, want %s as KAI was seen to place it", pod.Spec.NodeName, kaiAffinityLanding)
	}
}

// kaiAffinityLanding is where KAI was seen to place the affinity form's
// pod in TestKAIWithAffinityForm: not the preferred node.
const kaiAffinityLanding = "gpu-a100"

// runningOf are the named pods that run.
func (e *kaiEnv) runningOf(t *testing.T, names []string) []string {
	t.Helper()
	var out []string
	for _, name := range names {
		p, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
		if err == nil && p.Status.Phase == corev1.PodRunning {
			out = append(out, name)
		}
	}
	return out
}

// jobsOf are the job names of pods named job-0.
func jobsOf(pods []string) []string {
	var out []string
	for _, p := range pods {
		out = append(out, strings.TrimSuffix(p, "-0"))
	}
	return out
}
