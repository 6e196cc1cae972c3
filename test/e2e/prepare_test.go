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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/checkpoint"
	"github.com/prismgpu/prism/test/testbed"
)

// prepareEnv is one node with the plugin on an 8×H100 fleet.
type prepareEnv struct {
	ctx     context.Context
	cluster *testbed.Cluster
	node    *testbed.Node
	plugin  *pluginProc
}

func newPrepareEnv(t *testing.T, fleet string, pluginEnv ...string) *prepareEnv {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	p := startPlugin(ctx, t, cluster, node, fleetPath(fleet), pluginEnv...)
	waitForSlice(ctx, t, cluster.Client, node.Name, countDevices(t, fleet))
	return &prepareEnv{ctx: ctx, cluster: cluster, node: node, plugin: p}
}

// runOneGPUPod starts a pod whose claim asks for one GPU and waits until it
// runs.
func (e *prepareEnv) runOneGPUPod(t *testing.T, name string) {
	t.Helper()
	createTemplate(e.ctx, t, e.cluster.Client, "one-gpu", gpuClaimSpec(1))
	createPod(e.ctx, t, e.cluster.Client, podWithClaim(name, "one-gpu", ""))
	if _, err := testbed.WaitForPod(e.ctx, e.cluster.Client, "default", name, time.Minute, testbed.PodRunning); err != nil {
		t.Fatal(err)
	}
}

func countDevices(t *testing.T, fleet string) int {
	switch fleet {
	case "h100-sxm-8.yaml", "a100-40gb-8.yaml", "mixed.yaml":
		return 8
	case "l4-4.yaml":
		return 4
	case "t4-2.yaml":
		return 2
	}
	t.Fatalf("unknown fleet %s", fleet)
	return 0
}

// expectedIDs are the CDI device IDs Prism returns for a claim.
func expectedIDs(claim *resourceapi.ResourceClaim) []string {
	var ids []string
	for _, r := range claim.Status.Allocation.Devices.Results {
		ids = append(ids, cdi.DeviceID(string(claim.UID), r.Device))
	}
	slices.Sort(ids)
	return ids
}

// resolveWithCDICache loads the node's CDI root with the CDI library's own
// cache, as a container runtime would, and injects the IDs into an OCI spec.
func resolveWithCDICache(t *testing.T, root string, ids []string) *specs.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(root), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatalf("CDI cache over %s: %v", root, err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache errors: %v", errs)
	}
	oci := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	if unresolved, err := cache.InjectDevices(oci, ids...); err != nil {
		t.Fatalf("inject %v (unresolved %v): %v", ids, unresolved, err)
	}
	return oci
}

func specFiles(t *testing.T, root string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(root, "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func TestPrepareUnprepareLifecycle(t *testing.T) {
	env := newPrepareEnv(t, "h100-sxm-8.yaml")
	client := env.cluster.Client
	createTemplate(env.ctx, t, client, "two-gpus", gpuClaimSpec(2))
	createPod(env.ctx, t, client, podWithClaim("trainer", "two-gpus", ""))
	pod, err := testbed.WaitForPod(env.ctx, client, "default", "trainer", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	claim := podClaim(env.ctx, t, client, pod)
	want := expectedIDs(claim)

	created := env.node.Runtime.Created("default", "trainer")
	if len(created) != 1 {
		t.Fatalf("fake CRI created %d containers, want 1", len(created))
	}
	got := slices.Sorted(slices.Values(created[0].CDIDevices))
	if !slices.Equal(got, want) {
		t.Fatalf("CreateContainer got CDI devices %v, want Prism's %v", got, want)
	}

	oci := resolveWithCDICache(t, env.plugin.CDIRoot, got)
	var nodes []string
	for _, d := range oci.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		minor := strings.TrimPrefix(r.Device, "gpu-")
		if !slices.Contains(nodes, "/dev/nvidia"+minor) {
			t.Errorf("injected device nodes %v lack /dev/nvidia%s for %s", nodes, minor, r.Device)
		}
	}
	if !slices.ContainsFunc(oci.Process.Env, func(e string) bool { return strings.HasPrefix(e, "NVIDIA_VISIBLE_DEVICES=GPU-") }) {
		t.Errorf("injected env %v lacks NVIDIA_VISIBLE_DEVICES with GPU UUIDs", oci.Process.Env)
	}

	deletePod(env.ctx, t, env.cluster, "trainer")
	waitFor(t, "CDI spec removed after unprepare", func() bool { return len(specFiles(t, env.plugin.CDIRoot)) == 0 })
	if claims := readCheckpoint(t, env.plugin.StateDir); len(claims) != 0 {
		t.Errorf("checkpoint still holds %v after unprepare", claims)
	}
}

func TestSharedClaimAcrossPods(t *testing.T) {
	env := newPrepareEnv(t, "h100-sxm-8.yaml")
	client := env.cluster.Client
	_, err := client.ResourceV1().ResourceClaims("default").Create(env.ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Spec:       gpuClaimSpec(1),
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"reader-a", "reader-b"} {
		createPod(env.ctx, t, client, podWithClaim(name, "", "shared"))
	}
	var ids [][]string
	for _, name := range []string{"reader-a", "reader-b"} {
		if _, err := testbed.WaitForPod(env.ctx, client, "default", name, time.Minute, testbed.PodRunning); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, env.node.Runtime.Created("default", name)[0].CDIDevices)
	}
	if !slices.Equal(ids[0], ids[1]) || len(ids[0]) != 1 {
		t.Fatalf("the two consumers got %v and %v, want the same single device", ids[0], ids[1])
	}
	if files := specFiles(t, env.plugin.CDIRoot); len(files) != 1 {
		t.Fatalf("want one CDI spec for the shared claim, found %v", files)
	}
	if n := promValue(t, env.plugin.HTTPAddr, `prism_plugin_requests_total{method="prepare",result="success"}`); n < 1 {
		t.Errorf("prepare requests = %v", n)
	}

	deletePod(env.ctx, t, env.cluster, "reader-a")
	// Still in use by reader-b: the kubelet must not unprepare yet.
	time.Sleep(2 * time.Second)
	if files := specFiles(t, env.plugin.CDIRoot); len(files) != 1 {
		t.Fatalf("spec removed while reader-b still uses the claim: %v", files)
	}
	deletePod(env.ctx, t, env.cluster, "reader-b")
	waitFor(t, "shared claim released after its last consumer", func() bool { return len(specFiles(t, env.plugin.CDIRoot)) == 0 })
}

// TestCrashAtEveryStep kills the plugin with SIGKILL at each named point of
// prepare and unprepare, restarts it, and checks that the node converges:
// no device held by two claims, no orphaned spec, and the replayed prepare
// hands the container the same IDs.
func TestCrashAtEveryStep(t *testing.T) {
	env := newPrepareEnv(t, "h100-sxm-8.yaml")
	client := env.cluster.Client
	createTemplate(env.ctx, t, client, "one-gpu", gpuClaimSpec(1))

	for i, point := range plugin.CrashPoints {
		t.Run(point, func(t *testing.T) {
			pod := "crash-" + string(rune('a'+i))
			unprepare := strings.HasPrefix(point, "unprepare")
			if !unprepare {
				env.restartPlugin(t, "PRISM_CRASH_AT="+point)
			}
			createPod(env.ctx, t, client, podWithClaim(pod, "one-gpu", ""))
			if unprepare {
				if _, err := testbed.WaitForPod(env.ctx, client, "default", pod, time.Minute, testbed.PodRunning); err != nil {
					t.Fatal(err)
				}
				env.restartPlugin(t, "PRISM_CRASH_AT="+point)
				if err := client.CoreV1().Pods("default").Delete(env.ctx, pod, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			env.waitForCrash(t, point)
			assertConsistent(t, env)
			env.restartPlugin(t)
			nudgePod(env.ctx, t, client, pod)

			if unprepare {
				deletePod(env.ctx, t, env.cluster, pod)
			} else {
				p, err := testbed.WaitForPod(env.ctx, client, "default", pod, 2*time.Minute, testbed.PodRunning)
				if err != nil {
					t.Fatal(err)
				}
				claim := podClaim(env.ctx, t, client, p)
				for _, c := range env.node.Runtime.Created("default", pod) {
					if got := slices.Sorted(slices.Values(c.CDIDevices)); !slices.Equal(got, expectedIDs(claim)) {
						t.Errorf("after replay the container got %v, want %v", got, expectedIDs(claim))
					}
				}
				deletePod(env.ctx, t, env.cluster, pod)
			}
			env.waitDrained(t, "node drained")
		})
	}
}

// TestRestartsKeepPreparedState restarts the plugin, then the kubelet, while a
// pod runs: the claim stays prepared exactly once, and neither restart writes
// the checkpoint or the spec again.
func TestRestartsKeepPreparedState(t *testing.T) {
	env := newPrepareEnv(t, "h100-sxm-8.yaml")
	env.runOneGPUPod(t, "steady")
	before := snapshot(t, env)

	env.restartPlugin(t)
	if after := snapshot(t, env); after != before {
		t.Errorf("plugin restart changed prepared state:\nbefore %s\nafter  %s", before, after)
	}

	env.node.StopKubelet()
	if err := env.node.StartKubelet(env.ctx); err != nil {
		t.Fatal(err)
	}
	if err := env.node.WaitReady(env.ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	// The kubelet keeps its own record of prepared claims (v1.37 does not
	// replay NodePrepareResources for running pods), so recovery shows in two
	// ways: nothing was prepared again, and the pod's end still unprepares.
	if after := snapshot(t, env); after != before {
		t.Errorf("kubelet restart changed prepared state:\nbefore %s\nafter  %s", before, after)
	}
	if n := promValue(t, env.plugin.HTTPAddr, `prism_plugin_requests_total{method="prepare",result="success"}`); n != 0 {
		t.Errorf("the restarted plugin prepared %v claims again, want 0", n)
	}
	if claims := readCheckpoint(t, env.plugin.StateDir); len(claims) != 1 {
		t.Errorf("checkpoint holds %d claims, want 1", len(claims))
	}
	deletePod(env.ctx, t, env.cluster, "steady")
	env.waitDrained(t, "unprepare after both restarts")
}

// TestPodDeletedWhileKubeletDownIsReleased covers the kubelet's blind spot: a
// pod deleted while its kubelet is down is cleaned up as an orphan without
// NodeUnprepareResources. The plugin notices that the claim is gone from the
// API and releases its device, so the node does not lose a GPU for good.
func TestPodDeletedWhileKubeletDownIsReleased(t *testing.T) {
	env := newPrepareEnv(t, "t4-2.yaml")
	client := env.cluster.Client
	env.runOneGPUPod(t, "orphaned")
	env.node.StopKubelet()
	// Without a kubelet the pod only goes away when forced, as an operator
	// draining a dead node would do.
	zero := int64(0)
	if err := client.CoreV1().Pods("default").Delete(env.ctx, "orphaned", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	if err := env.node.StartKubelet(env.ctx); err != nil {
		t.Fatal(err)
	}
	env.waitDrained(t, "stale claim released")
	if n := promValue(t, env.plugin.HTTPAddr, `prism_plugin_checkpoint_recoveries_total{kind="stale-released"}`); n != 1 {
		t.Errorf("stale-released recoveries = %v, want 1", n)
	}
}

// TestCorruptCheckpointIsMovedAside damages the checkpoint of a live node: the
// plugin must start anyway, say so on the Node, and rebuild from the kubelet.
func TestCorruptCheckpointIsMovedAside(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func([]byte) []byte
	}{
		{"garbage", func([]byte) []byte { return []byte("\x00\x01 not json") }},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }},
		{"checksum", func(b []byte) []byte {
			return []byte(strings.Replace(string(b), "PrepareCompleted", "PrepareStarted", 1))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newPrepareEnv(t, "t4-2.yaml")
			client := env.cluster.Client
			env.runOneGPUPod(t, "victim")
			env.plugin.Kill()
			path := filepath.Join(env.plugin.StateDir, checkpoint.DefaultFileName)
			data := mustReadFile(t, path)
			if err := os.WriteFile(path, tc.corrupt(data), 0o600); err != nil {
				t.Fatal(err)
			}
			env.restartPlugin(t)
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) != 1 {
				t.Errorf("want the damaged checkpoint moved aside once, found %v", aside)
			}
			waitFor(t, "CheckpointCorrupt event on the Node", func() bool {
				evs, err := client.CoreV1().Events("default").List(env.ctx, metav1.ListOptions{FieldSelector: "reason=CheckpointCorrupt"})
				return err == nil && len(evs.Items) > 0 && evs.Items[0].InvolvedObject.Kind == "Node"
			})
			// The running pod's claim is rebuilt from its spec and the API,
			// so its spec stays and its GPU stays guarded.
			if files := specFiles(t, env.plugin.CDIRoot); len(files) != 1 {
				t.Errorf("want the running pod's spec kept, found %v", files)
			}
			if claims := readCheckpoint(t, env.plugin.StateDir); len(claims) != 1 || claims[0].Name == "" {
				t.Errorf("checkpoint not rebuilt with the running claim: %+v", claims)
			}
			deletePod(env.ctx, t, env.cluster, "victim")
			env.waitDrained(t, "adopted claim unprepared")
		})
	}
}

// waitDrained waits until the node holds no prepared claim: no CDI spec and
// an empty checkpoint.
func (e *prepareEnv) waitDrained(t *testing.T, what string) {
	t.Helper()
	waitFor(t, what, func() bool {
		return len(specFiles(t, e.plugin.CDIRoot)) == 0 && len(readCheckpoint(t, e.plugin.StateDir)) == 0
	})
}

func (e *prepareEnv) restartPlugin(t *testing.T, extraEnv ...string) {
	t.Helper()
	_ = e.plugin.Stop(5 * time.Second)
	e.plugin.restart(e.ctx, t, extraEnv...)
}

func (e *prepareEnv) waitForCrash(t *testing.T, point string) {
	t.Helper()
	select {
	case <-e.plugin.Done():
	case <-time.After(time.Minute):
		t.Fatalf("plugin did not reach crash point %s", point)
	}
}

// assertConsistent checks the on-disk state a crash left behind, before the
// restart repairs anything: whatever it is, no device may be in two claims.
func assertConsistent(t *testing.T, env *prepareEnv) {
	t.Helper()
	holders := map[string]string{}
	for _, c := range readCheckpoint(t, env.plugin.StateDir) {
		for _, d := range c.Devices {
			if other, ok := holders[d.Name]; ok {
				t.Errorf("device %s is held by claims %s and %s", d.Name, other, c.UID)
			}
			holders[d.Name] = c.UID
		}
	}
}

// readCheckpoint loads a copy of the plugin's checkpoint, so that the test
// never writes the live file.
func readCheckpoint(t *testing.T, stateDir string) []checkpoint.Claim {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(stateDir, checkpoint.DefaultFileName))
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, checkpoint.DefaultFileName), data, 0o600); err != nil {
		t.Fatal(err)
	}
	store, rec, err := checkpoint.Open(context.Background(), dir, checkpoint.Options{})
	if err != nil || rec.Corruption != nil {
		t.Fatalf("checkpoint unreadable: %v %v", err, rec.Corruption)
	}
	return store.List()
}

// snapshot is the prepared state as bytes and modification times: equal
// snapshots mean nothing was re-prepared.
func snapshot(t *testing.T, env *prepareEnv) string {
	t.Helper()
	var b strings.Builder
	paths := append([]string{filepath.Join(env.plugin.StateDir, checkpoint.DefaultFileName)}, specFiles(t, env.plugin.CDIRoot)...)
	for _, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := os.ReadFile(p)
		b.WriteString(filepath.Base(p) + "@" + fi.ModTime().Format(time.RFC3339Nano) + "#" + itoa(len(data)) + " ")
	}
	return b.String()
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	err := wait.PollUntilContextTimeout(context.Background(), 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	})
	if err != nil {
		t.Fatalf("timed out waiting for %s", what)
	}
}
