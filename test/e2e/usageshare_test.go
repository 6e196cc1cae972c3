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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
)

const gi = int64(1) << 30

// TestSharesSizedByMeasuredUse runs the sharing loop end to end on one
// 8×H100 node whose GPUs are published shareable, with the stand-in MPS
// control daemon:
//
//   - a light job's first run has a whole GPU; the plugin samples NVML
//     (30 % duty cycle, 6Gi) and writes the run into its profile;
//   - the next two runs each get the share sized from it by hand: 30 % +
//     10 points of headroom = 40 % compute, 6Gi × 1.2 + 512Mi = 7.7Gi → 8Gi;
//     both land on one GPU, each with an MPS daemon of its own whose
//     default is its memory limit, with no cap on its SMs, and each
//     container is told the limit too;
//   - a heavy profiled job and an unprofiled one get whole GPUs;
//   - a plugin SIGKILL leaves the daemons running and the new plugin
//     adopts them; each share's end stops its own;
//   - a run that held 10Gi of its 8Gi share is recorded as exceeding it,
//     and the job's next share has twice the memory;
//   - with its p50 lowered to 20 %, that share is counted at 30 %, the
//     plan names its peak of 40 %, and nothing caps its SMs.
func TestSharesSizedByMeasuredUse(t *testing.T) {
	mpsBin := buildStandIn(t, "fake-mps-control", "nvidia-cuda-mps-control")
	record := filepath.Join(t.TempDir(), "mps.log")
	// The plugins inherit the test's environment.
	t.Setenv("FAKE_MPS_CONTROL_RECORD", record)
	e := newControllerEnvWith(t, func(o *bed.Options) {
		o.Nodes = []bed.NodeSpec{{Name: "gpu-h100", Fleet: "h100-sxm-8.yaml"}}
		o.MPSControl = mpsBin
		o.PluginFlags = append(o.PluginFlags, "--usage-interval=250ms")
	})
	if e.minor < 36 {
		t.Skipf("DRAConsumableCapacity is off by default on Kubernetes 1.%d", e.minor)
	}
	usageFile := e.bed.UsageFiles["gpu-h100"]
	cdiRoot := filepath.Join(e.cluster.Nodes()[0].Dir, "cdi")

	never := prismv1alpha1.WorkloadProfileSpec{DisableAutoProfiling: true}
	e.createUsageProfile(t, "light", never, nil)
	e.createUsageProfile(t, "heavy", never, &prismv1alpha1.UsageProfile{
		Runs: 1, Samples: 60, DutyCycleP50MilliPercent: milli(90000), DutyCycleP95MilliPercent: milli(95000),
		PeakMemory: ptrQuantity(30 * gi),
	})
	for name, profile := range map[string]string{"light": "light", "heavy": "heavy", "plain": ""} {
		e.profiledTemplate(t, name, profile, gpuClaimSpec(1))
	}

	// The first run: whole GPUs, each showing 30 % and 6Gi in use.
	writeUsage(t, usageFile, func(index int) nvml.GPUUsage {
		return nvml.GPUUsage{Index: index, UtilizationPercent: 30, MemoryUsedBytes: uint64(6 * gi)}
	})
	_, first := e.runPod(t, "light-1", "light")
	if r := first.Status.Allocation.Devices.Results[0]; r.Request != "gpu" {
		t.Errorf("first run, with nothing measured, allocated through %s; want the request as written", r.Request)
	}
	time.Sleep(2 * time.Second) // about 8 samples; a run needs usage.MinSamples
	deletePod(e.ctx, t, e.cluster, "light-1")
	u := e.waitForUsage(t, "light", func(u *prismv1alpha1.UsageProfile) bool { return u.Runs == 1 })
	if got := [2]int32{deref(u.DutyCycleP95MilliPercent), int32(u.PeakMemory.Value() / gi)}; got != [2]int32{30000, 6} {
		t.Errorf("first run measured p95 %d m%%, peak %d Gi; want 30000 and 6", got[0], got[1])
	}
	// Its busy time: at most every sample at 30 % of 250 ms.
	wholeRuns := u.Models
	if len(wholeRuns) != 1 || wholeRuns[0].ProductName != u.ProductName || wholeRuns[0].Runs != 1 ||
		wholeRuns[0].BusyMilliseconds <= 0 || wholeRuns[0].BusyMilliseconds > int64(u.Samples)*75 {
		t.Errorf("first run's busy time per model %+v; want one run on %s, busy for up to %d ms", wholeRuns, u.ProductName, int64(u.Samples)*75)
	}
	writeUsage(t, usageFile, nil)

	// Two shares of one GPU, each with its MPS memory limit.
	e.waitForShare(t, "light", 40, 40, 8*gi)
	shares := map[string]*resourceapi.ResourceClaim{}
	for _, pod := range []string{"light-a", "light-b"} {
		_, claim := e.runPod(t, pod, "light")
		shares[pod] = claim
		r := claim.Status.Allocation.Devices.Results[0]
		if r.Request != "gpu/"+rewrite.ShareTierName {
			t.Errorf("%s allocated through %s, want gpu/%s", pod, r.Request, rewrite.ShareTierName)
		}
		consumed := map[string]int64{}
		for name, q := range r.ConsumedCapacity {
			consumed[string(name)] = q.Value()
		}
		want := map[string]int64{string(gpuv1alpha1.ComputeCapacity.Qualified()): 40, string(gpuv1alpha1.MemoryCapacity.Qualified()): 8 * gi}
		if diff := cmp.Diff(want, consumed); diff != "" {
			t.Errorf("%s consumed (-want +got):\n%s", pod, diff)
		}
		env := containerEnv(t, e, cdiRoot, pod)
		if want := "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M"; !slices.Contains(env, want) {
			t.Errorf("%s: container env lacks %s: %v", pod, want, env)
		}
		if slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=") }) {
			t.Errorf("%s: container env caps the share's SMs, which its claim does not ask for: %v", pod, env)
		}
		if !slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "CUDA_MPS_PIPE_DIRECTORY=") }) {
			t.Errorf("%s: container env names no MPS pipe directory: %v", pod, env)
		}
	}
	sharedGPU := allocatedDevice(e.ctx, t, e.cluster.Client, shares["light-a"])
	if b := shares["light-b"].Status.Allocation.Devices.Results[0].Device; b != sharedGPU.Name {
		t.Errorf("the two 40%% shares landed on %s and %s; want one GPU", sharedGPU.Name, b)
	}
	// Each share has a daemon of its own, whose default is its memory
	// limit.
	uuid := stringAttr(sharedGPU, string(gpuv1alpha1.UUIDAttribute))
	limited := []string{"start " + uuid,
		"set_default_device_pinned_mem_limit 0 8192M " + uuid, "get_default_device_pinned_mem_limit 0 " + uuid}
	keyA, keyB := shareDaemonKey(shares["light-a"]), shareDaemonKey(shares["light-b"])
	wantDaemons := map[string][]string{keyA: limited, keyB: limited}
	if diff := cmp.Diff(wantDaemons, daemonEvents(t, record)); diff != "" {
		t.Errorf("MPS daemons of the two shares (-want +got):\n%s", diff)
	}

	// Heavy and unprofiled jobs keep whole GPUs, without MPS.
	for _, tc := range []struct{ pod, template string }{
		{"heavy-1", "heavy"},
		{"plain-1", "plain"},
	} {
		_, claim := e.runPod(t, tc.pod, tc.template)
		r := claim.Status.Allocation.Devices.Results[0]
		if r.Device == sharedGPU.Name || r.Request != "gpu" {
			t.Errorf("%s allocated %s through %s; want a whole GPU of its own, as asked", tc.pod, r.Device, r.Request)
		}
		if memory := r.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]; memory.Value() < 79*gi {
			t.Errorf("%s consumed %s of the GPU's memory; want all of it", tc.pod, memory.String())
		}
		if env := containerEnv(t, e, cdiRoot, tc.pod); slices.ContainsFunc(env, func(s string) bool { return strings.HasPrefix(s, "CUDA_MPS_") }) {
			t.Errorf("%s holds a whole GPU but was set up for MPS: %v", tc.pod, env)
		}
		deletePod(e.ctx, t, e.cluster, tc.pod)
	}

	// A plugin that dies leaves the daemon to the next one.
	if err := e.bed.KillPlugin(e.ctx, "gpu-h100"); err != nil {
		t.Fatalf("restart the plugin: %v", err)
	}
	if diff := cmp.Diff(wantDaemons, daemonEvents(t, record)); diff != "" {
		t.Errorf("after a plugin restart the MPS daemons were stopped or started again; want them adopted (-want +got):\n%s", diff)
	}

	// Each share's own processes, told apart by their pods' cgroups; the
	// second run outgrows its memory share.
	index := int(*sharedGPU.Attributes[gpuv1alpha1.IndexAttribute.Qualified()].IntValue)
	pidA := processInPodCgroup(t, e.podUID(t, "light-a"))
	pidB := processInPodCgroup(t, e.podUID(t, "light-b"))
	processes := func(aMemory int64) func(int) nvml.GPUUsage {
		return func(i int) nvml.GPUUsage {
			if i != index {
				return nvml.GPUUsage{Index: i}
			}
			return nvml.GPUUsage{Index: i, UtilizationPercent: 60, MemoryUsedBytes: uint64(aMemory + 6*gi), Processes: []nvml.ProcessUsage{
				{PID: uint32(pidA), UtilizationPercent: 30, MemoryUsedBytes: uint64(aMemory)},
				{PID: uint32(pidB), UtilizationPercent: 30, MemoryUsedBytes: uint64(6 * gi)},
			}}
		}
	}
	writeUsage(t, usageFile, processes(6*gi))
	time.Sleep(2 * time.Second)
	deletePod(e.ctx, t, e.cluster, "light-b")
	u = e.waitForUsage(t, "light", func(u *prismv1alpha1.UsageProfile) bool { return u.Runs == 2 })
	if u.Exceeded != nil || u.Share == nil || u.Share.ComputePercent != 0 || u.Share.Memory == nil || u.Share.Memory.Value() != 8*gi {
		t.Errorf("light-b's run within its share recorded share %+v, exceeded %+v; want the 8Gi it was held to and no compute cap, not exceeded", u.Share, u.Exceeded)
	}
	writeUsage(t, usageFile, processes(10*gi))
	time.Sleep(2 * time.Second)
	deletePod(e.ctx, t, e.cluster, "light-a")
	u = e.waitForUsage(t, "light", func(u *prismv1alpha1.UsageProfile) bool { return u.Runs == 3 })
	if u.Exceeded == nil || !slices.Contains(u.Exceeded.Resources, prismv1alpha1.ShareResourceMemory) {
		t.Errorf("light-a held 10Gi of an 8Gi share; its run recorded exceeded %+v", u.Exceeded)
	}
	if diff := cmp.Diff(wholeRuns, u.Models); diff != "" {
		t.Errorf("runs on shares changed the busy time per model (-first run +now):\n%s", diff)
	}
	stopped := append(slices.Clone(limited), "quit "+uuid, "exit "+uuid)
	waitFor(t, "each share's MPS daemon stopped after its share", func() bool {
		return cmp.Equal(map[string][]string{keyA: stopped, keyB: stopped}, daemonEvents(t, record))
	})
	writeUsage(t, usageFile, nil)

	// The next run gets twice the memory it outgrew: 16Gi.
	// The job turns bursty: its p50 falls to 20 % while its p95 stays
	// 30 % (set by hand, since the stand-in NVML reports one figure a
	// run). Its next share is counted at 30 %, and its peak of 40 % caps
	// nothing: its daemon sets no thread percentage.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var wp prismv1alpha1.WorkloadProfile
		if err := e.prism.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: "light"}, &wp); err != nil {
			return err
		}
		wp.Status.Usage.DutyCycleP50MilliPercent = milli(20000)
		return e.prism.Status().Update(e.ctx, &wp)
	}); err != nil {
		t.Fatalf("make profile light bursty: %v", err)
	}
	plan := e.waitForShare(t, "light", 30, 40, 16*gi)
	_, next := e.runPod(t, "light-c", "light")
	r := next.Status.Allocation.Devices.Results[0]
	if memory := r.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]; r.Request != "gpu/"+rewrite.ShareTierName || memory.Value() != 16*gi {
		t.Errorf("light-c after an exceeded run: allocated through %s consuming %v; want a 16Gi share", r.Request, r.ConsumedCapacity)
	}
	if compute := r.ConsumedCapacity[gpuv1alpha1.ComputeCapacity.Qualified()]; compute.Value() != plan.ComputePercent {
		t.Errorf("light-c consumed %s compute, want the %d%% the controller planned", compute.String(), plan.ComputePercent)
	}
	cUUID := stringAttr(allocatedDevice(e.ctx, t, e.cluster.Client, next), string(gpuv1alpha1.UUIDAttribute))
	wantC := []string{"start " + cUUID, "set_default_device_pinned_mem_limit 0 16384M " + cUUID, "get_default_device_pinned_mem_limit 0 " + cUUID}
	if got := daemonEvents(t, record)[shareDaemonKey(next)]; !cmp.Equal(wantC, got) || plan.ComputePeakPercent != 40 {
		t.Errorf("light-c's MPS daemon: %q, want %q, its memory limit alone; plan %+v, want a peak of 40%%", got, wantC, plan)
	}
	deletePod(e.ctx, t, e.cluster, "light-c")
}

// createUsageProfile creates a profile with the given usage (none: nil).
func (e *controllerEnv) createUsageProfile(t *testing.T, name string, spec prismv1alpha1.WorkloadProfileSpec, u *prismv1alpha1.UsageProfile) {
	t.Helper()
	wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: spec}
	if err := e.prism.Create(e.ctx, wp); err != nil {
		t.Fatal(err)
	}
	if u == nil {
		return
	}
	wp.Status.Usage = u
	if err := e.prism.Status().Update(e.ctx, wp); err != nil {
		t.Fatalf("set usage of profile %s: %v", name, err)
	}
}

// waitForUsage waits until the profile's status.usage satisfies done and
// returns it.
func (e *controllerEnv) waitForUsage(t *testing.T, profile string, done func(*prismv1alpha1.UsageProfile) bool) *prismv1alpha1.UsageProfile {
	t.Helper()
	var got *prismv1alpha1.UsageProfile
	waitFor(t, "usage of profile "+profile, func() bool {
		var wp prismv1alpha1.WorkloadProfile
		if err := e.prism.Get(e.ctx, client.ObjectKey{Namespace: "default", Name: profile}, &wp); err != nil {
			return false
		}
		got = wp.Status.Usage
		return got != nil && done(got)
	})
	return got
}

// waitForShare waits until the controller, which reads profiles from an
// informer, plans a share for a claim of the profile with the compute,
// peak (the compute itself where it has none above it) and memory given,
// and returns the plan.
func (e *controllerEnv) waitForShare(t *testing.T, profile string, compute, peak, memory int64) rewrite.SharePlan {
	t.Helper()
	var last rewrite.SharePlan
	err := waitForCond(func() bool {
		c, err := e.cluster.Client.ResourceV1().ResourceClaims("default").Create(e.ctx, &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Annotations: map[string]string{prismv1alpha1.ProfileAnnotation: profile}},
			Spec:       gpuClaimSpec(1),
		}, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false
		}
		last = sharePlan(t, c)
		return last.Verdict == rewrite.ShareSized.String() && last.ComputePercent == compute && max(last.ComputePercent, last.ComputePeakPercent) == peak &&
			last.Memory != nil && last.Memory.Value() == memory
	})
	if err != nil {
		t.Fatalf("profile %s: want a share of %d%% peaking at %d%% with %d bytes, the controller plans %+v", profile, compute, peak, memory, last)
	}
	return last
}

func waitForCond(cond func() bool) error {
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out")
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

// sharePlan is the share part of the claim's rewrite plan (empty if none).
func sharePlan(t *testing.T, claim *resourceapi.ResourceClaim) rewrite.SharePlan {
	t.Helper()
	return ptr.Deref(claimPlan(t, claim).Share, rewrite.SharePlan{})
}

// writeUsage sets what the node's eight simulated GPUs show in use; nil
// figures leave every GPU idle.
func writeUsage(t *testing.T, path string, figures func(index int) nvml.GPUUsage) {
	t.Helper()
	var u nvml.Usage
	if figures != nil {
		for i := range 8 {
			u.GPUs = append(u.GPUs, figures(i))
		}
	}
	if err := nvml.WriteUsage(path, u); err != nil {
		t.Fatal(err)
	}
}

// containerEnv is the environment the runtime gave the pod's container
// from its CDI devices.
func containerEnv(t *testing.T, e *controllerEnv, cdiRoot, pod string) []string {
	t.Helper()
	created := e.cluster.Nodes()[0].Runtime.Created("default", pod)
	if len(created) == 0 {
		t.Fatalf("pod %s has no container", pod)
	}
	return resolveWithCDICache(t, cdiRoot, created[0].CDIDevices).Process.Env
}

// daemonEvents are the stand-in MPS daemons' starts, commands and exits
// as "start GPU-…", "quit GPU-…", "exit GPU-…", by the daemon's key.
func daemonEvents(t *testing.T, record string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, entry := range mpstest.Read(t, record) {
		key := filepath.Base(filepath.Dir(entry.PipeDir))
		switch {
		case entry.Role != "daemon":
		case entry.Event == "command":
			out[key] = append(out[key], entry.Command+" "+entry.VisibleDevices)
		case entry.Event == "start" || entry.Event == "exit":
			out[key] = append(out[key], entry.Event+" "+entry.VisibleDevices)
		}
	}
	return out
}

// shareDaemonKey names the MPS daemon of a claim's share, as the plugin's
// state directory does: the claim's UID and the device's name.
func shareDaemonKey(claim *resourceapi.ResourceClaim) string {
	return string(claim.UID) + "-" + claim.Status.Allocation.Devices.Results[0].Device
}

func (e *controllerEnv) podUID(t *testing.T, name string) types.UID {
	t.Helper()
	pod, err := e.cluster.Client.CoreV1().Pods("default").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return pod.UID
}

// processInPodCgroup starts a process in a cgroup named as the kubelet
// names a pod's, so that the plugin, reading the process's cgroup from
// /proc, takes it for one of the pod's: the simulated GPU then lists it
// as a GPU process. Real cgroups, on either cgroup version.
func processInPodCgroup(t *testing.T, pod types.UID) int {
	t.Helper()
	root := "/sys/fs/cgroup"
	if _, err := os.Stat(filepath.Join(root, "cgroup.controllers")); err != nil {
		root = filepath.Join(root, "pids") // cgroup v1: any one hierarchy
	}
	parent := filepath.Join(root, fmt.Sprintf("prism-e2e-%d", os.Getpid()))
	dir := filepath.Join(parent, "pod"+string(pod))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("make a pod cgroup: %v", err)
	}
	cmd := exec.Command("sleep", "3600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = os.Remove(dir)
		_ = os.Remove(parent) // fails while another pod's cgroup is left
	})
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0o644); err != nil {
		t.Fatalf("move process %d into %s: %v", cmd.Process.Pid, dir, err)
	}
	return cmd.Process.Pid
}

func deref(p *int32) int32 {
	if p == nil {
		return -1
	}
	return *p
}

func ptrQuantity(bytes int64) *resource.Quantity {
	return resource.NewQuantity(bytes, resource.BinarySI)
}
