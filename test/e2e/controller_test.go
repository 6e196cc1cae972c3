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
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/pkg/rewrite"
	"github.com/prismgpu/prism/test/testbed"
)

// controllerEnv is a heterogeneous cluster (8×H100 SXM, 8×A100-40GB, 4×L4,
// one real kubelet and plugin each) with prism-controller serving its
// webhooks over real TLS.
type controllerEnv struct {
	ctx     context.Context
	cluster *testbed.Cluster
	prism   client.Client
	minor   int
	bed     *bed.Bed
}

// newControllerEnv starts the environment with the controller's preference
// mode: ladder unless preference says "affinity".
func newControllerEnv(t *testing.T, preference ...string) *controllerEnv {
	return newControllerEnvWith(t, func(opts *bed.Options) {
		for _, p := range preference {
			// The chart's RBAC and webhooks for the mode, and the flag.
			opts.ChartSets = append(opts.ChartSets, "rewrite.preference="+p)
			opts.ControllerFlags = append(opts.ControllerFlags, "--preference="+p)
		}
	})
}

// newControllerEnvWith is newControllerEnv with the bed's options changed
// by configure.
func newControllerEnvWith(t *testing.T, configure func(*bed.Options)) *controllerEnv {
	ctx, cluster := testbed.ForTest(t, testbed.Options{CRDDirs: bed.CRDDirs(repoRoot)})
	// GPUs are shareable by memory: the placement rules must hold with
	// sharing on, and a profile that allows it asks for its footprint.
	opts := bed.Options{RepoRoot: repoRoot, PluginBin: pluginBinary, ControllerBin: controllerBinary,
		PluginFlags: []string{"--consumable-capacity"}}
	configure(&opts)
	b, err := bed.Setup(ctx, cluster, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Stop)
	c := prismClient(t, cluster)
	return &controllerEnv{ctx: ctx, cluster: cluster, prism: c, minor: serverMinor(t, cluster), bed: b}
}

// serverMinor is the test bed's Kubernetes minor version (make
// test-versions runs these tests on older releases).
func serverMinor(t *testing.T, cluster *testbed.Cluster) int {
	t.Helper()
	v, err := cluster.Client.Discovery().ServerVersion()
	if err != nil {
		t.Fatalf("read the API server's version: %v", err)
	}
	minor, err := strconv.Atoi(strings.TrimSuffix(v.Minor, "+"))
	if err != nil {
		t.Fatalf("API server minor version %q: %v", v.Minor, err)
	}
	return minor
}

// checkPlacement asserts the model a job landed on where the scheduler
// chooses the node by the claim's firstAvailable ladder. kube-scheduler
// scores nodes by the subrequest a claim gets there only from 1.35 on
// (DynamicResources' Score); before that the ladder orders the devices
// within a node and the node is chosen as for a plain claim, so which
// model a job lands on among several that fit is not Prism's to promise.
// Call it last in a subtest: the skip keeps failures reported before it.
func (e *controllerEnv) checkPlacement(t *testing.T, job, got string) {
	t.Helper()
	if e.minor < 35 {
		t.Skipf("placement not asserted on Kubernetes 1.%d: kube-scheduler scores nodes by firstAvailable subrequest from 1.35 on (the job got %s)", e.minor, got)
	}
	if want := placement(t, job); got != want {
		t.Errorf("%s got %s, want %s", job, got, want)
	}
}

// prismctl runs prismctl against the test cluster and returns what it
// printed; a failing command fails the test.
func (e *controllerEnv) prismctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(prismctlBinary, append(args, "--kubeconfig", e.cluster.KubeconfigPath)...).CombinedOutput()
	if err != nil {
		t.Fatalf("prismctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	t.Logf("prismctl %s:\n%s", strings.Join(args, " "), out)
	return string(out)
}

// explainClaim is prismctl explain claim for a claim in the default
// namespace.
func (e *controllerEnv) explainClaim(t *testing.T, claim string) string {
	t.Helper()
	return e.prismctl(t, "explain", "claim", claim, "-n", "default")
}

// createProfile creates a WorkloadProfile and sets its measured status.
func (e *controllerEnv) createProfile(t *testing.T, name string, spec prismv1alpha1.WorkloadProfileSpec, status prismv1alpha1.WorkloadProfileStatus) error {
	t.Helper()
	wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}
	if err := e.prism.Create(e.ctx, wp); err != nil {
		return err
	}
	wp.Status = status
	if err := e.prism.Status().Update(e.ctx, wp); err != nil {
		t.Fatalf("set status of profile %s: %v", name, err)
	}
	// The controller reads profiles from an informer; give it the update.
	waitFor(t, "controller sees profile "+name, func() bool {
		return e.dryRunRewrites(t, name)
	})
	return nil
}

// dryRunRewrites asks the API server to admit a claim for the profile
// without storing it, and reports whether the controller annotated it.
func (e *controllerEnv) dryRunRewrites(t *testing.T, profile string) bool {
	plan, ok := e.dryRunPlan(profile)
	return ok && plan.BoundType != ""
}

// dryRunPlan admits a one-GPU claim for the profile without storing it and
// returns the plan the controller annotated it with; false where the API
// server refused the claim or the plan does not decode.
func (e *controllerEnv) dryRunPlan(profile string) (rewrite.Plan, bool) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "probe-" + profile, Namespace: "default", Annotations: map[string]string{"prism.dev/profile": profile}},
		Spec:       gpuClaimSpec(1),
	}
	out, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Create(e.ctx, claim, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return rewrite.Plan{}, false
	}
	var plan rewrite.Plan
	if err := json.Unmarshal([]byte(out.Annotations[rewrite.AnnotationKey]), &plan); err != nil {
		return rewrite.Plan{}, false
	}
	return plan, true
}

func (e *controllerEnv) profiledTemplate(t *testing.T, name, profile string, spec resourceapi.ResourceClaimSpec) {
	t.Helper()
	meta := metav1.ObjectMeta{}
	if profile != "" {
		meta.Annotations = map[string]string{"prism.dev/profile": profile}
	}
	_, err := e.cluster.Client.ResourceV1().ResourceClaimTemplates("default").Create(e.ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       resourceapi.ResourceClaimTemplateSpec{ObjectMeta: meta, Spec: spec},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// runPod starts a pod on the template and returns the product of the GPU
// it got and its claim.
func (e *controllerEnv) runPod(t *testing.T, name, template string) (string, *resourceapi.ResourceClaim) {
	t.Helper()
	createPod(e.ctx, t, e.cluster.Client, podWithClaim(name, template, ""))
	pod, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", name, 2*time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(e.ctx, t, e.cluster.Client, pod)
	return stringAttr(allocatedDevice(e.ctx, t, e.cluster.Client, claim), "productName"), claim
}

// runPodUntilEnd is runPod for a pod that only lives as long as the subtest,
// so that a failing subtest cannot leave GPUs taken for the next one.
func (e *controllerEnv) runPodUntilEnd(t *testing.T, name, template string) (string, *resourceapi.ResourceClaim) {
	t.Helper()
	t.Cleanup(func() { deletePod(e.ctx, t, e.cluster, name) })
	return e.runPod(t, name, template)
}

func milli(p int32) *int32 { return &p }

func withPeak(s prismv1alpha1.WorkloadProfileStatus, peak resource.Quantity) prismv1alpha1.WorkloadProfileStatus {
	s.PeakMemory = &peak
	return s
}

const h100, a100, l4 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA L4"

var memoryBound = prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeMemoryBound, SMThroughputMilliPercent: milli(20000), MemoryThroughputMilliPercent: milli(91000)}

// placements are the e2e placement cases, in order: the model each
// profiled job must land on, the cluster holding what the earlier cases
// and hogs left. TestProfileAwarePlacement checks them with the ladder,
// TestAffinityPlacesAsTheLadder with the node-affinity design.
var placements = []struct {
	pod, template string
	// hog, when set, is a plain 8-GPU pod pinned to that model and
	// started before the job; it stays.
	hog, want string
}{
	{"stream-1", "stream", "", h100},
	{"small-stream-1", "small-stream", "", h100},
	{"tiny-1", "tiny", "", l4},
	{"gemm-1", "gemm", h100, a100},
	{"stream-2", "stream", a100, l4},
}

func placement(t *testing.T, pod string) string {
	t.Helper()
	for _, p := range placements {
		if p.pod == pod {
			return p.want
		}
	}
	t.Fatalf("no placement case %s", pod)
	return ""
}

// placementProfiles creates the profiles and templates the placement cases
// use.
func (e *controllerEnv) placementProfiles(t *testing.T) {
	t.Helper()
	q20 := resource.MustParse("20Gi")
	for _, p := range []struct {
		name   string
		spec   prismv1alpha1.WorkloadProfileSpec
		status prismv1alpha1.WorkloadProfileStatus
	}{
		{"stream", prismv1alpha1.WorkloadProfileSpec{}, memoryBound},
		{"gemm", prismv1alpha1.WorkloadProfileSpec{}, prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeComputeBound, SMThroughputMilliPercent: milli(93000), MemoryThroughputMilliPercent: milli(12000), PeakMemory: &q20}},
		{"tiny", prismv1alpha1.WorkloadProfileSpec{Policy: prismv1alpha1.PolicyEconomy}, prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeLatencyBound, SMThroughputMilliPercent: milli(4000), MemoryThroughputMilliPercent: milli(3000)}},
		{"small-stream", prismv1alpha1.WorkloadProfileSpec{Sharing: prismv1alpha1.SharingFractional}, withPeak(memoryBound, q20)},
	} {
		if err := e.createProfile(t, p.name, p.spec, p.status); err != nil {
			t.Fatal(err)
		}
	}
	for _, tmpl := range []struct{ name, profile string }{{"stream", "stream"}, {"gemm", "gemm"}, {"tiny", "tiny"}, {"small-stream", "small-stream"}, {"unknown", "never-profiled"}, {"plain", ""}} {
		e.profiledTemplate(t, tmpl.name, tmpl.profile, gpuClaimSpec(1))
	}
	for _, model := range []string{h100, a100} {
		e.profiledTemplate(t, hogTemplate(model), "", gpuClaimSpec(8, `device.attributes["gpu.prism.dev"].productName == "`+model+`"`))
	}
}

func hogTemplate(model string) string {
	return map[string]string{h100: "all-h100", a100: "all-a100"}[model]
}

// hog fills every GPU of model with one plain pod.
func (e *controllerEnv) hog(t *testing.T, model string) {
	t.Helper()
	name := "hog-" + strings.TrimPrefix(hogTemplate(model), "all-")
	createPod(e.ctx, t, e.cluster.Client, podWithClaim(name, hogTemplate(model), ""))
	if _, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", name, time.Minute, testbed.PodRunning); err != nil {
		t.Fatal(err)
	}
}

func TestProfileAwarePlacement(t *testing.T) {
	e := newControllerEnv(t)
	e.placementProfiles(t)

	t.Run("memory-bound lands on H100 and is explained", func(t *testing.T) {
		got, claim := e.runPodUntilEnd(t, "stream-1", "stream")
		defer e.checkPlacement(t, "stream-1", got)
		if claim.Spec.Devices.Requests[0].FirstAvailable == nil {
			t.Errorf("claim was not rewritten: %+v", claim.Spec.Devices.Requests[0])
		}
		if !strings.Contains(claim.Annotations[rewrite.AnnotationKey], "MemoryBound") {
			t.Errorf("rewrite annotation %q does not explain the bound type", claim.Annotations[rewrite.AnnotationKey])
		}
		out := e.explainClaim(t, claim.Name)
		// "*" marks the subrequest the claim was allocated through:
		// gpu/bandwidth-top where placement is asserted.
		allocatedThrough := "* " + claim.Status.Allocation.Devices.Results[0].Request
		for _, want := range []string{"gpu-h100", "gpu-l4", "matches gpu/bandwidth-top", "matches gpu/fits", allocatedThrough} {
			if !strings.Contains(out, want) {
				t.Errorf("explain output lacks %q:\n%s", want, out)
			}
		}
		// The claim had no name yet at admission; its pod carries the event.
		waitFor(t, "Rewritten event on the pod", func() bool {
			evs, err := e.cluster.Client.CoreV1().Events("default").List(e.ctx, metav1.ListOptions{FieldSelector: "reason=Rewritten,involvedObject.kind=Pod,involvedObject.name=stream-1"})
			return err == nil && len(evs.Items) > 0
		})
	})

	t.Run("a profile that allows sharing asks for its footprint", func(t *testing.T) {
		got, claim := e.runPodUntilEnd(t, "small-stream-1", "small-stream")
		defer e.checkPlacement(t, "small-stream-1", got)
		r := claim.Status.Allocation.Devices.Results[0]
		if e.minor < 36 {
			// DRAConsumableCapacity is off by default before 1.36: the API
			// server drops the GPUs' shareability and the claim's share, the
			// job gets a whole GPU, and the plugin says why on the node.
			if len(r.ConsumedCapacity) != 0 {
				t.Errorf("consumed %v of a GPU on a cluster without DRAConsumableCapacity, want a whole GPU", r.ConsumedCapacity)
			}
			waitFor(t, "a ConsumableCapacityDropped event on a node", func() bool {
				evs, err := e.cluster.Client.CoreV1().Events("").List(e.ctx, metav1.ListOptions{FieldSelector: "reason=ConsumableCapacityDropped,involvedObject.kind=Node"})
				return err == nil && len(evs.Items) > 0
			})
			return
		}
		// 20Gi measured + 10 % + 2Gi of headroom, in whole GiB.
		if q, ok := r.ConsumedCapacity["gpu.prism.dev/memory"]; !ok || q.String() != "24Gi" {
			t.Errorf("consumed %v of the GPU's memory, want the 24Gi footprint share", r.ConsumedCapacity)
		}
	})

	t.Run("latency-bound with economy lands on L4", func(t *testing.T) {
		got, _ := e.runPodUntilEnd(t, "tiny-1", "tiny")
		e.checkPlacement(t, "tiny-1", got)
	})

	t.Run("no annotation leaves the claim byte for byte", func(t *testing.T) {
		_, claim := e.runPodUntilEnd(t, "plain-1", "plain")
		tmpl, err := e.cluster.Client.ResourceV1().ResourceClaimTemplates("default").Get(e.ctx, "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		want, _ := json.Marshal(tmpl.Spec.Spec)
		got, _ := json.Marshal(claim.Spec)
		if string(got) != string(want) {
			t.Errorf("claim spec changed:\n got %s\nwant %s", got, want)
		}
		if _, ok := claim.Annotations[rewrite.AnnotationKey]; ok {
			t.Error("claim without a profile got a rewrite annotation")
		}
	})

	t.Run("unknown profile gets the claim profiled", func(t *testing.T) {
		_, claim := e.runPodUntilEnd(t, "unknown-1", "unknown")
		found := slices.ContainsFunc(claim.Spec.Devices.Config, func(c resourceapi.DeviceClaimConfiguration) bool {
			return c.Opaque != nil && c.Opaque.Driver == "gpu.prism.dev" && strings.Contains(string(c.Opaque.Parameters.Raw), `"profiling":{"enabled":true`)
		})
		if !found {
			t.Errorf("claim for an unknown profile carries no profiling config: %+v", claim.Spec.Devices.Config)
		}
	})

	// Fill the H100s, then the A100s, with plain claims; profiled jobs must
	// still run where their hard needs allow.
	t.Run("compute-bound 20GB never lands on L4", func(t *testing.T) {
		e.hog(t, h100)
		got, _ := e.runPodUntilEnd(t, "gemm-1", "gemm")
		if got == l4 {
			t.Errorf("a 20 GB compute-bound job landed on a 24 GB L4")
		}
		if want := placement(t, "gemm-1"); got != want {
			t.Errorf("with the H100s full, the compute-bound job got %s, want %s", got, want)
		}
	})

	t.Run("every preferred class full falls back and schedules", func(t *testing.T) {
		e.hog(t, a100)
		got, claim := e.runPod(t, "stream-2", "stream")
		if want := placement(t, "stream-2"); got != want {
			t.Errorf("with the H100s and A100s full, the memory-bound job got %s, want the fallback %s", got, want)
		}
		if r := claim.Status.Allocation.Devices.Results[0].Request; !strings.HasSuffix(r, "/fits") {
			t.Errorf("allocated through subrequest %s, want the last (fits) alternative", r)
		}
	})

	t.Run("hostile profiles are rejected or ignored, never spliced into CEL", func(t *testing.T) {
		huge := resource.MustParse("100Ti")
		err := e.createProfile(t, "huge", prismv1alpha1.WorkloadProfileSpec{MinMemory: &huge}, memoryBound)
		if err == nil || !strings.Contains(err.Error(), "minMemory") {
			t.Errorf("profile with minMemory 100Ti: want a rejection naming minMemory, got %v", err)
		}
		err = e.createProfile(t, "quotes", prismv1alpha1.WorkloadProfileSpec{MinComputeCapability: `8.0" || true || "`}, memoryBound)
		if err == nil {
			t.Error("profile with CEL in minComputeCapability was admitted")
		}
		// Status is written through its own subresource, past validation: a
		// hostile measurement must make the rewrite skip, not emit odd CEL.
		wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: "sneaky", Namespace: "default"}}
		if err := e.prism.Create(e.ctx, wp); err != nil {
			t.Fatal(err)
		}
		huge900 := resource.MustParse("900Ti")
		wp.Status = memoryBound
		wp.Status.PeakMemory = &huge900
		if err := e.prism.Status().Update(e.ctx, wp); err != nil {
			t.Fatal(err)
		}
		e.profiledTemplate(t, "sneaky", "sneaky", gpuClaimSpec(1, `device.attributes["gpu.prism.dev"].index >= 0`))
		createPod(e.ctx, t, e.cluster.Client, podWithClaim("sneaky-1", "sneaky", ""))
		waitFor(t, "claim generated", func() bool {
			list, err := e.cluster.Client.ResourceV1().ResourceClaims("default").List(e.ctx, metav1.ListOptions{})
			if err != nil {
				return false
			}
			for _, c := range list.Items {
				if c.Annotations["prism.dev/profile"] == "sneaky" {
					assertCatalogueOnly(t, c, `device.attributes["gpu.prism.dev"].index >= 0`)
					return true
				}
			}
			return false
		})
	})
}

// assertCatalogueOnly fails if the claim has a selector that is neither the
// user's nor one the rewrite generates (catalogue entries, joined).
func assertCatalogueOnly(t *testing.T, c resourceapi.ResourceClaim, user ...string) {
	t.Helper()
	check := func(sels []resourceapi.DeviceSelector) {
		for _, s := range sels {
			if s.CEL == nil || slices.Contains(user, s.CEL.Expression) {
				continue
			}
			if _, generated := rewrite.Conjuncts(s.CEL.Expression); !generated {
				t.Errorf("claim %s carries a selector outside the catalogue: %q", c.Name, s.CEL.Expression)
			}
		}
	}
	for _, r := range c.Spec.Devices.Requests {
		if r.Exactly != nil {
			check(r.Exactly.Selectors)
		}
		for _, sub := range r.FirstAvailable {
			check(sub.Selectors)
		}
	}
}

// warnings collects the admission warnings the API server returns.
type warnings struct {
	mu   sync.Mutex
	text []string
}

func (w *warnings) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

func (w *warnings) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return strings.Join(w.text, "\n")
}

// TestFirstHourViews covers what a new user meets first: a profile
// annotation in the wrong place is called out at apply time and by
// prismctl explain; explain says who holds the GPUs it will not get; and
// prismctl get gpus shows the fleet with its holders.
func TestFirstHourViews(t *testing.T) {
	e := newControllerEnv(t)
	var warned warnings
	cfg := rest.CopyConfig(e.cluster.Config)
	cfg.WarningHandler = &warned
	userClient, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	// The natural place, the template's own metadata, is not where claims
	// get their annotations from.
	_, err = userClient.ResourceV1().ResourceClaimTemplates("default").Create(e.ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "misplaced", Annotations: map[string]string{"prism.dev/profile": "train"}},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: gpuClaimSpec(1)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl apply would print:\n%s", warned.String())
	if !strings.Contains(warned.String(), "prism.dev/profile=train on ResourceClaimTemplate misplaced's own metadata is ignored") {
		t.Errorf("no admission warning about the misplaced annotation, got %q", warned.String())
	}
	e.profiledTemplate(t, "plain", "", gpuClaimSpec(1))

	_, holder := e.runPodUntilEnd(t, "holder-1", "plain")
	_, misplaced := e.runPodUntilEnd(t, "misplaced-1", "misplaced")

	t.Run("explain names the misplaced annotation and who holds each GPU", func(t *testing.T) {
		out := e.explainClaim(t, misplaced.Name)
		for _, want := range []string{
			"Note:     prism.dev/profile=train on ResourceClaimTemplate misplaced's own metadata is ignored",
			"HELD BY",
			"default/" + holder.Name + " (",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("explain output lacks %q", want)
			}
		}
		// GPUs are shared by memory here; the holder asked for no amount,
		// so it took a whole GPU's worth.
		if !strings.Contains(out, "but its memory is held by default/"+holder.Name) && !strings.Contains(out, "but default/"+holder.Name+" holds it") {
			t.Errorf("explain does not say the holder's GPU is taken")
		}
	})

	t.Run("get gpus lists the fleet with holders and pods", func(t *testing.T) {
		out := e.prismctl(t, "get", "gpus")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 21 || !strings.HasPrefix(lines[0], "NODE") {
			t.Errorf("want a header and 20 GPU rows, got %d lines", len(lines))
		}
		for _, want := range []string{"NVIDIA H100 80GB HBM3", "NVIDIA L4", "default/" + holder.Name + " (", "pod holder-1", "pod misplaced-1"} {
			if !strings.Contains(out, want) {
				t.Errorf("get gpus output lacks %q", want)
			}
		}
	})

	t.Run("unknown subcommands fail", func(t *testing.T) {
		out, err := exec.Command(prismctlBinary, "explain", "foo").CombinedOutput()
		if err == nil {
			t.Errorf("prismctl explain foo succeeded:\n%s", out)
		}
	})
}
