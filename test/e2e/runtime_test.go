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
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/test/testbed"
)

// The real-runtime tests run pods in containers: containerd and runc on the
// kubelet's node, Prism's CDI specs applied by containerd, and the test
// images (pause, busybox workload) built locally and imported, never pulled.

// testImages are the test bed's pause and workload images as OCI archives.
type testImages struct {
	pause, workload recipe.Result
}

// buildImages builds the named images as OCI archives under the e2e's
// repository and returns them in that order, with their tag.
func buildImages(ctx context.Context, t *testing.T, names ...string) ([]recipe.Result, string) {
	t.Helper()
	o, err := recipe.DefaultOptions(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	o.Repository = e2eRepository
	dir := t.TempDir()
	start := time.Now()
	res, err := recipe.Build(ctx, o, names, func(name string) string { return filepath.Join(dir, name+".tar") })
	if err != nil {
		t.Fatalf("build the images %s: %v", strings.Join(names, ", "), err)
	}
	refs := make([]string, len(res))
	for i, r := range res {
		refs[i] = r.Ref
	}
	t.Logf("built %s in %s", strings.Join(refs, ", "), time.Since(start).Round(time.Second))
	return res, o.Tag
}

func buildTestImages(ctx context.Context, t *testing.T) testImages {
	t.Helper()
	res, _ := buildImages(ctx, t, "pause", "workload")
	return testImages{pause: res[0], workload: res[1]}
}

// containerdNode adds a node whose pods run under containerd, which reads
// the CDI specs from where the Prism plugin of startPlugin writes them. More
// image archives, such as Prism's own, are imported beside pause and
// workload.
func containerdNode(ctx context.Context, t *testing.T, c *testbed.Cluster, name string, images testImages, more ...string) (*testbed.Node, string) {
	t.Helper()
	cdiRoot := filepath.Join(c.WorkDir(), "nodes", name, "cdi")
	if err := os.MkdirAll(cdiRoot, 0o755); err != nil {
		t.Fatal(err)
	}
	node, err := c.AddNode(ctx, testbed.NodeOptions{Name: name, Containerd: &testbed.ContainerdOptions{
		CDISpecDirs:  []string{cdiRoot},
		Images:       append([]string{images.pause.Path, images.workload.Path}, more...),
		SandboxImage: images.pause.Ref,
	}})
	if err != nil {
		t.Fatal(err)
	}
	return node, cdiRoot
}

// inventoryScript prints what the container was given, one fact a line:
// "env K=V", "dev PATH TYPE MAJOR:MINOR" (hex, as stat prints them),
// "mount TARGET OPTIONS", then "inventory done".
const inventoryScript = `
env | grep -E '^(NVIDIA_|PRISM_)' | sort | sed 's/^/env /'
for f in /dev/nvidia*; do stat -c 'dev %n %F %t:%T' "$f"; done
grep ' /usr/lib/x86_64-linux-gnu/' /proc/mounts | while read -r src target fs opts rest; do echo "mount $target $opts"; done
echo inventory done
exec sleep 3600
`

func inventoryPod(name, template, image string) *corev1.Pod {
	pod := podWithClaim(name, template, "")
	pod.Spec.HostNetwork = true
	c := &pod.Spec.Containers[0]
	c.Image, c.ImagePullPolicy = image, corev1.PullNever
	c.Command = []string{"/bin/sh", "-c", inventoryScript}
	return pod
}

// inventory is what the workload container reported.
type inventory struct {
	env    map[string]string
	dev    map[string]string // path -> "character special file 195:0" (decimal)
	mounts map[string]string // target -> options
}

func parseInventory(t *testing.T, log string) inventory {
	t.Helper()
	inv := inventory{env: map[string]string{}, dev: map[string]string{}, mounts: map[string]string{}}
	for _, line := range strings.Split(log, "\n") {
		kind, rest, _ := strings.Cut(line, " ")
		switch kind {
		case "env":
			k, v, _ := strings.Cut(rest, "=")
			inv.env[k] = v
		case "dev":
			// "/dev/nvidia0 character special file c3:0"
			path, rest, _ := strings.Cut(rest, " ")
			i := strings.LastIndex(rest, " ")
			majMin := strings.Split(rest[i+1:], ":")
			maj, err1 := strconv.ParseInt(majMin[0], 16, 64)
			min, err2 := strconv.ParseInt(majMin[len(majMin)-1], 16, 64)
			if len(majMin) != 2 || err1 != nil || err2 != nil {
				t.Fatalf("unreadable device line %q", line)
			}
			inv.dev[path] = fmt.Sprintf("%s %d:%d", rest[:i], maj, min)
		case "mount":
			target, opts, _ := strings.Cut(rest, " ")
			inv.mounts[target] = opts
		}
	}
	return inv
}

// waitForLog waits until the pod's container log, as containerd wrote it in
// the kubelet's pod log directory, contains marker, and returns its
// messages. The file is read on the host because the test bed's API server
// holds no kubelet client certificate, so `kubectl logs` cannot reach the
// kubelet.
func waitForLog(t *testing.T, node *testbed.Node, pod, marker string) string {
	t.Helper()
	var log string
	waitFor(t, "log of "+pod+" to contain "+strconv.Quote(marker), func() bool {
		files, _ := filepath.Glob(filepath.Join(node.Dir, "pod-logs", "default_"+pod+"_*", "*", "*.log"))
		var b strings.Builder
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			b.WriteString(criLogMessages(string(data)))
		}
		log = b.String()
		return strings.Contains(log, marker)
	})
	return log
}

// criLogMessages strips the CRI log format's "<time> <stream> <tag> " prefix
// from every line.
func criLogMessages(raw string) string {
	var b strings.Builder
	for _, line := range strings.SplitAfter(raw, "\n") {
		if fields := strings.SplitN(line, " ", 4); len(fields) == 4 {
			b.WriteString(fields[3])
		}
	}
	return b.String()
}

// TestWorkloadSeesItsGPUInARealContainer runs a workload with a Prism claim
// in a real container and reads back what containerd applied from Prism's
// CDI spec: only the allocated GPU's device node (with the fleet's numbers),
// the driver's control nodes, the claim's env and the driver libraries of
// the fake driver root, read-only. Deleting the pod unprepares the claim.
func TestWorkloadSeesItsGPUInARealContainer(t *testing.T) {
	testbed.RequireRoot(t)
	images := buildTestImages(context.Background(), t)
	ctx, cluster := testbed.ForTest(t, testbed.Options{StandInImage: images.pause.Ref})
	node, cdiRoot := containerdNode(ctx, t, cluster, "localhost", images)
	createPrismDeviceClass(ctx, t, cluster)
	p := startPlugin(ctx, t, cluster, node, fleetPath("h100-sxm-8.yaml"))
	if p.CDIRoot != cdiRoot {
		t.Fatalf("the plugin writes CDI specs to %s, containerd reads %s", p.CDIRoot, cdiRoot)
	}
	waitForSlice(ctx, t, cluster.Client, node.Name, 8)
	client := cluster.Client

	createTemplate(ctx, t, client, "one-gpu", gpuClaimSpec(1))
	_, claim, inv := runInventoryPod(ctx, t, client, node, "inventory", "one-gpu", images.workload.Ref)
	checkInventory(ctx, t, client, inv, claim, filepath.Join(p.StateDir, "fake-driver-root"))

	specs := specFiles(t, cdiRoot)
	if len(specs) != 1 {
		t.Fatalf("want one CDI spec for the claim, found %v", specs)
	}
	deletePod(ctx, t, cluster, "inventory")
	// The plugin removes the spec before it writes the checkpoint without
	// the claim, so the two are awaited together.
	waitFor(t, "CDI spec removed and the claim gone from the checkpoint after unprepare", func() bool {
		return len(specFiles(t, cdiRoot)) == 0 && len(readCheckpoint(t, p.StateDir)) == 0
	})
	// The kubelet removes a dead pod's containers at its next container
	// garbage collection, up to a minute later; what matters here is that
	// the workload no longer runs.
	waitFor(t, "the workload's container stopped in containerd", func() bool {
		ids, err := node.Containerd.Ctr(ctx, "containers", "list", "--quiet", "labels.\"io.kubernetes.pod.name\"==inventory")
		if err != nil {
			return false
		}
		tasks, err := node.Containerd.Ctr(ctx, "tasks", "list")
		if err != nil {
			return false
		}
		for _, line := range strings.Split(tasks, "\n") {
			f := strings.Fields(line)
			if len(f) == 3 && slices.Contains(strings.Fields(ids), f[0]) && f[2] != "STOPPED" {
				return false
			}
		}
		return true
	})
}

// runInventoryPod starts an inventory pod on a claim from template, waits
// until its container has reported, and returns the pod, its claim and the
// report.
func runInventoryPod(ctx context.Context, t *testing.T, client kubernetes.Interface, node *testbed.Node, name, template, image string) (*corev1.Pod, *resourceapi.ResourceClaim, inventory) {
	t.Helper()
	createPod(ctx, t, client, inventoryPod(name, template, image))
	pod, err := testbed.WaitForPod(ctx, client, "default", name, 2*time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	log := waitForLog(t, node, name, "inventory done")
	t.Logf("container inventory of %s:\n%s", name, log)
	return pod, podClaim(ctx, t, client, pod), parseInventory(t, log)
}

// checkInventory checks what the workload container of claim reported:
// only the allocated GPU's device node (with the fleet's numbers), the
// driver's control nodes, the claim's env, and the driver libraries of the
// fake driver root, read-only.
func checkInventory(ctx context.Context, t *testing.T, client kubernetes.Interface, inv inventory, claim *resourceapi.ResourceClaim, fakeDriverRoot string) {
	t.Helper()
	device := allocatedDevice(ctx, t, client, claim)
	minor, err := strconv.Atoi(strings.TrimPrefix(device.Name, "gpu-"))
	if err != nil {
		t.Fatalf("device name %q: %v", device.Name, err)
	}

	wantEnv := map[string]string{
		cdi.ClaimUIDEnvVar:       string(claim.UID),
		cdi.VisibleDevicesEnvVar: stringAttr(device, "uuid"),
	}
	for k, v := range wantEnv {
		if v == "" || inv.env[k] != v {
			t.Errorf("container env %s=%q, want %q (all: %v)", k, inv.env[k], v, inv.env)
		}
	}

	// The fleet's device nodes are plain files in the fake driver root; the
	// spec gives their numbers, and runc makes real character devices of
	// them inside the container: the allocated GPU's, and none of the
	// seven others.
	chr := "character special file"
	wantDev := map[string]string{
		"/dev/nvidia" + strconv.Itoa(minor): fmt.Sprintf("%s 195:%d", chr, minor),
		"/dev/nvidiactl":                    chr + " 195:255",
		"/dev/nvidia-uvm":                   chr + " 511:0",
		"/dev/nvidia-uvm-tools":             chr + " 511:1",
	}
	for path, want := range wantDev {
		if inv.dev[path] != want {
			t.Errorf("container's %s is %q, want %q", path, inv.dev[path], want)
		}
	}
	for path := range inv.dev {
		if _, ok := wantDev[path]; !ok {
			t.Errorf("container sees %s (%s), which its claim was not allocated", path, inv.dev[path])
		}
	}

	libs, _ := filepath.Glob(filepath.Join(fakeDriverRoot, "usr/lib/x86_64-linux-gnu", "*.so.*"))
	if len(libs) == 0 {
		t.Fatalf("no driver libraries in the fake driver root %s", fakeDriverRoot)
	}
	for _, l := range libs {
		target := "/usr/lib/x86_64-linux-gnu/" + filepath.Base(l)
		opts, ok := inv.mounts[target]
		if !ok || !slices.Contains(strings.Split(opts, ","), "ro") {
			t.Errorf("driver library %s: mounted %v with options %q, want a read-only mount", target, ok, opts)
		}
	}
}
