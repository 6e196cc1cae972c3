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
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/pkg/profile"
	"github.com/prismgpu/prism/test/testbed"
)

// TestProfiledClaimBecomesWorkloadProfile follows one profiled run: the claim
// is prepared with the profiling edits and nothing else, the report lands in
// the claim's directory, and unprepare turns it into a WorkloadProfile.
func TestProfiledClaimBecomesWorkloadProfile(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, testbed.Options{CRDDirs: []string{filepath.Join(repoRoot, "deployments", "crds")}})
	node, err := cluster.AddNode(ctx, testbed.NodeOptions{Name: "localhost"})
	if err != nil {
		t.Fatal(err)
	}
	createPrismDeviceClass(ctx, t, cluster)
	p := startPluginWithFlags(ctx, t, cluster, node, fleetPath("h100-sxm-8.yaml"), []string{"--ncu-path=" + buildStandInNCU(t)})
	waitForSlice(ctx, t, cluster.Client, node.Name, 8)
	createProfiledTemplate(ctx, t, cluster, "vecadd", "vecadd", `"profiling":{"enabled":true,"launchCount":5}`)
	createPod(ctx, t, cluster.Client, podWithClaim("vecadd", "vecadd", ""))
	pod, err := testbed.WaitForPod(ctx, cluster.Client, "default", "vecadd", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(ctx, t, cluster.Client, pod)

	// The container runtime sees only CDI devices; the profiling lives in
	// the edits those devices resolve to.
	ids := node.Runtime.Created("default", "vecadd")[0].CDIDevices
	if !slices.Equal(slices.Sorted(slices.Values(ids)), expectedIDs(claim)) {
		t.Fatalf("container got CDI devices %v, want %v", ids, expectedIDs(claim))
	}
	oci := resolveWithCDICache(t, p.CDIRoot, ids)
	env := strings.Join(oci.Process.Env, "\n")
	for _, want := range []string{profiling.EnvNCU + "=", profiling.EnvProfileDir + "=" + profiling.ContainerProfileDir} {
		if !strings.Contains(env, want) {
			t.Errorf("resolved env lacks %q:\n%s", want, env)
		}
	}
	// The shim comes through the preload list: an LD_PRELOAD edit would
	// replace the workload's own.
	if strings.Contains(env, "LD_PRELOAD=") {
		t.Errorf("resolved env sets LD_PRELOAD:\n%s", env)
	}
	var mounts []string
	for _, m := range oci.Mounts {
		mounts = append(mounts, m.Destination)
	}
	for _, want := range []string{profiling.ContainerNCUDir, profiling.ContainerProfileDir, profiling.ContainerShimPath, profiling.ContainerPreloadList} {
		if !slices.Contains(mounts, want) {
			t.Errorf("resolved mounts %v lack %s", mounts, want)
		}
	}
	if args := string(mustReadFile(t, filepath.Join(profiling.ClaimDir(p.StateDir, string(claim.UID)), profiling.ArgsFile))); !strings.Contains(args, "--launch-count\n5") {
		t.Errorf("ncu arguments %q do not carry the claim's launch count", args)
	}

	// Stand in for the profiled container: it leaves ncu's report behind.
	report := mustReadFile(t, filepath.Join(repoRoot, "pkg", "ncu", "testdata", "vectoradd_raw.csv"))
	writeFile(t, filepath.Join(profiling.ClaimDir(p.StateDir, string(claim.UID)), profiling.ReportFile), report)
	deletePod(ctx, t, cluster, "vecadd")

	wp := waitForProfile(ctx, t, cluster, "vecadd")
	if wp.Status.BoundType != prismv1alpha1.BoundTypeMemoryBound {
		t.Errorf("bound type %s, want MemoryBound for vector add", wp.Status.BoundType)
	}
	// vectoradd_raw.csv, captured on an H100, reads 82.28 % memory
	// throughput.
	if m := wp.Status.MemoryThroughputMilliPercent; m == nil || *m != 82_280 {
		t.Errorf("memory throughput %s, want the report's 82.28%%", profile.FormatMilliPercent(ptr.Deref(m, -1)))
	}
	if wp.Status.Device == nil || wp.Status.Device.ProductName != "NVIDIA H100 80GB HBM3" {
		t.Errorf("profiled device %+v, want the H100 it ran on", wp.Status.Device)
	}

	out, err := runKubectl(cluster, "get", "workloadprofiles", "-n", "default")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if r := wp.Status.Report; r == nil || r.SizeBytes != int64(len(report)) || len(r.SHA256) != 64 {
		t.Errorf("status.report %+v, want the digest of the %d-byte report", r, len(report))
	}
	// Percentages as a person reads them, from vectoradd_raw.csv: SM
	// 33.55 %, memory 82.28 %, achieved occupancy 76.46 %.
	for _, want := range []string{"BOUND", "SM", "MEMORY", "OCCUPANCY", "AGE", "MemoryBound", "33.6%", "82.3%", "76.5%"} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl get workloadprofiles lacks %q:\n%s", want, out)
		}
	}
}

// createProfiledTemplate creates a one-GPU template whose claims name
// profile and carry a GpuConfig with the given fields, such as a
// "profiling" object.
func createProfiledTemplate(ctx context.Context, t *testing.T, cluster *testbed.Cluster, name, profile, gpuConfigFields string) {
	t.Helper()
	spec := gpuClaimSpec(1)
	spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: "gpu.prism.dev", Parameters: runtime.RawExtension{
			Raw: []byte(`{"apiVersion":"gpu.prism.dev/v1alpha1","kind":"GpuConfig",` + gpuConfigFields + `}`),
		}},
	}}}
	_, err := cluster.Client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{"prism.dev/profile": profile}},
			Spec:       spec,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// waitForProfile waits until the plugin has published the WorkloadProfile
// with a bound type.
func waitForProfile(ctx context.Context, t *testing.T, cluster *testbed.Cluster, name string) prismv1alpha1.WorkloadProfile {
	t.Helper()
	c := prismClient(t, cluster)
	var wp prismv1alpha1.WorkloadProfile
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKey{Namespace: "default", Name: name}, &wp); err != nil {
			return false, client.IgnoreNotFound(err)
		}
		return wp.Status.BoundType != "", nil
	})
	if err != nil {
		t.Fatalf("no WorkloadProfile %s with a bound type: %v (status %+v)", name, err, wp.Status)
	}
	return wp
}
