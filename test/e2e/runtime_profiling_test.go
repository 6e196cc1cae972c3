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
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/test/testbed"
)

// TestProfilingInARealContainer profiles a workload the way a GPU node
// does, with nothing stood in for but ncu: containerd applies the claim's
// CDI edits, glibc's loader in the container reads the mounted preload
// list, the compiled shim re-executes the workload under the stand-in ncu
// mounted from the host, the report lands in the claim's directory on the
// host, and unprepare turns it into a WorkloadProfile.
func TestProfilingInARealContainer(t *testing.T) {
	testbed.RequireRoot(t)
	images := buildTestImages(context.Background(), t)
	ctx, cluster := testbed.ForTest(t, testbed.Options{
		StandInImage: images.pause.Ref,
		CRDDirs:      []string{filepath.Join(repoRoot, "deployments", "crds")},
	})
	node, cdiRoot := containerdNode(ctx, t, cluster, "localhost", images)
	createPrismDeviceClass(ctx, t, cluster)
	p := startPluginWithFlags(ctx, t, cluster, node, fleetPath("h100-sxm-8.yaml"), []string{"--ncu-path=" + buildStandInNCU(t)})
	if p.CDIRoot != cdiRoot {
		t.Fatalf("the plugin writes CDI specs to %s, containerd reads %s", p.CDIRoot, cdiRoot)
	}
	waitForSlice(ctx, t, cluster.Client, node.Name, 8)
	createProfiledTemplate(ctx, t, cluster, "vecadd", "vecadd-in-container", `"profiling":{"enabled":true}`)

	// dash is dynamically linked, so the loader reads the preload list;
	// while profiled its stdout is ncu's report, so it speaks on stderr,
	// naming its parent process. (No "$(": Kubernetes expands it.)
	pod := podWithClaim("vecadd", "vecadd", "")
	pod.Spec.HostNetwork = true
	pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	c := &pod.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = images.workload.Ref, corev1.PullNever
	c.Command = []string{"/bin/dash", "-c", "echo workload ran >&2; echo parent=`cat /proc/$PPID/comm` >&2; sleep 3"}
	createPod(ctx, t, cluster.Client, pod)
	running, err := testbed.WaitForPod(ctx, cluster.Client, "default", "vecadd", 2*time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	// The claim goes with the pod once it ends.
	claim := podClaim(ctx, t, cluster.Client, running)
	done, err := testbed.WaitForPod(ctx, cluster.Client, "default", "vecadd", 2*time.Minute, func(p *corev1.Pod) (bool, error) {
		return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	log := waitForLog(t, node, "vecadd", "parent=")
	t.Logf("workload container's log:\n%s", log)
	if done.Status.Phase != corev1.PodSucceeded {
		t.Errorf("profiled workload ended %s, want Succeeded", done.Status.Phase)
	}
	// The shim re-executed the workload under the stand-in ncu mounted at
	// /opt/prism/ncu.
	if !strings.Contains(log, "parent=ncu") {
		t.Errorf("the workload did not run under ncu; its log: %q", log)
	}

	deletePod(ctx, t, cluster, "vecadd")
	wp := waitForProfile(ctx, t, cluster, "vecadd-in-container")
	if wp.Status.BoundType != prismv1alpha1.BoundTypeMemoryBound {
		t.Errorf("bound type %s, want MemoryBound from the stand-in's vector-add report", wp.Status.BoundType)
	}
	if r := wp.Status.Report; r == nil || r.SizeBytes == 0 || len(r.SHA256) != 64 {
		t.Errorf("status.report %+v, want the digest of the container's report", r)
	}
	// The report the container wrote through its mount, as the plugin
	// archived it on the node. The plugin archives it after it has
	// published the profile, so it may not be there yet.
	var archived []string
	pattern := node.ViewPath(filepath.Join(p.StateDir, "profiles", "archive", "*-"+string(claim.UID), profiling.ReportFile))
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(context.Context) (bool, error) {
		archived, _ = filepath.Glob(pattern)
		return len(archived) > 0, nil
	}); err != nil || len(archived) != 1 {
		t.Fatalf("archived reports of claim %s: %v, want one: %v", claim.UID, archived, err)
	}
	if report := string(mustReadFile(t, archived[0])); !strings.Contains(report, "sm__throughput.avg.pct_of_peak_sustained_elapsed") {
		t.Errorf("the archived report is not ncu's CSV:\n%s", report)
	}
}
