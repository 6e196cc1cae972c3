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

// Package chart pins what the Helm chart renders: each test runs helm
// template with the test bed's helm and decodes the objects it checks.
package chart

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/test/testbed"
)

var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

var chartDir = filepath.Join(repoRoot, "deployments", "helm", "prism")

// rendered is what one helm template produced, by kind and name.
type rendered struct {
	daemonSets  map[string]*appsv1.DaemonSet
	deployments map[string]*appsv1.Deployment
	configMaps  map[string]*corev1.ConfigMap
	validating  map[string]*admissionregistrationv1.ValidatingWebhookConfiguration
	mutating    map[string]*admissionregistrationv1.MutatingWebhookConfiguration
	roles       map[string]*rbacv1.ClusterRole
}

// render runs helm template for Kubernetes 1.34 (the chart's minimum) with
// extra helm arguments such as --set.
func render(t *testing.T, args ...string) rendered {
	t.Helper()
	out := mustTemplate(t, args...)
	return rendered{
		daemonSets:  objectsOfKind[appsv1.DaemonSet](t, out, "DaemonSet"),
		deployments: objectsOfKind[appsv1.Deployment](t, out, "Deployment"),
		configMaps:  objectsOfKind[corev1.ConfigMap](t, out, "ConfigMap"),
		validating:  objectsOfKind[admissionregistrationv1.ValidatingWebhookConfiguration](t, out, "ValidatingWebhookConfiguration"),
		mutating:    objectsOfKind[admissionregistrationv1.MutatingWebhookConfiguration](t, out, "MutatingWebhookConfiguration"),
		roles:       objectsOfKind[rbacv1.ClusterRole](t, out, "ClusterRole"),
	}
}

// mustTemplate runs helm template and fails the test if helm refuses.
func mustTemplate(t *testing.T, args ...string) []byte {
	t.Helper()
	out, stderr, err := helmTemplate(t, args...)
	if err != nil {
		t.Fatalf("helm template %v: %v\n%s", args, err, stderr)
	}
	return out
}

// objectsOfKind decodes the rendered objects of one kind, by name.
func objectsOfKind[T any, PT interface {
	*T
	GetName() string
}](t *testing.T, out []byte, kind string) map[string]PT {
	t.Helper()
	objects := map[string]PT{}
	eachObject(t, out, func(k string, doc []byte) {
		if k == kind {
			decodeInto(t, doc, objects)
		}
	})
	return objects
}

// eachObject calls f with the kind and YAML of each rendered object.
func eachObject(t *testing.T, out []byte, f func(kind string, doc []byte)) {
	t.Helper()
	docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		doc, err := docs.Read()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("split rendered chart: %v", err)
		}
		var meta struct{ Kind string }
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("decode rendered object: %v\n%s", err, doc)
		}
		if meta.Kind != "" {
			f(meta.Kind, doc)
		}
	}
}

// helmTemplate runs helm template and returns what it wrote, for tests
// that expect it to fail.
func helmTemplate(t *testing.T, args ...string) (stdout []byte, stderr string, err error) {
	t.Helper()
	dir := os.Getenv(testbed.BinDirEnv)
	if dir == "" {
		t.Fatalf("%s is not set: build the test bed with hack/testbed-bins.sh (make testbed) and export %s to the directory it prints", testbed.BinDirEnv, testbed.BinDirEnv)
	}
	helm := filepath.Join(dir, "helm")
	if _, err := os.Stat(helm); err != nil {
		t.Fatalf("no helm in %s: run hack/testbed-bins.sh: %v", dir, err)
	}
	cmd := exec.Command(helm, append([]string{"template", "prism", chartDir, "--namespace", "prism-system", "--kube-version", "1.34.0"}, args...)...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	stdout, err = cmd.Output()
	return stdout, errBuf.String(), err
}

func decodeInto[T any, PT interface {
	*T
	GetName() string
}](t *testing.T, doc []byte, into map[string]PT) {
	t.Helper()
	obj := PT(new(T))
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("decode %T: %v\n%s", obj, err, doc)
	}
	into[obj.GetName()] = obj
}

func (r rendered) plugin(t *testing.T) *corev1.PodSpec {
	t.Helper()
	return &renderedObject(t, r.daemonSets, "DaemonSet", "prism-kubelet-plugin").Spec.Template.Spec
}

func (r rendered) controller(t *testing.T) *corev1.PodSpec {
	t.Helper()
	return &renderedObject(t, r.deployments, "Deployment", "prism-controller").Spec.Template.Spec
}

// renderedObject fails the test when the chart rendered no such object.
func renderedObject[T any](t *testing.T, objects map[string]*T, kind, name string) *T {
	t.Helper()
	o, ok := objects[name]
	if !ok {
		t.Fatalf("no %s %s rendered", kind, name)
	}
	return o
}

func container(t *testing.T, spec *corev1.PodSpec, name string) *corev1.Container {
	t.Helper()
	for i := range spec.Containers {
		if spec.Containers[i].Name == name {
			return &spec.Containers[i]
		}
	}
	t.Fatalf("no container %s", name)
	return nil
}

func httpPath(p *corev1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		return ""
	}
	return p.HTTPGet.Path
}

var simulatedFleet = "simulation.fleet=" + filepath.Join(repoRoot, "demo", "fleets", "mixed.yaml")

// Node Feature Discovery labels PCI devices by class and vendor by
// default; a node with only those labels must still get the plugin.
func TestPluginRunsOnNodesThatNodeFeatureDiscoveryLabelled(t *testing.T) {
	terms := render(t).plugin(t).Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	for _, label := range []string{
		"nvidia.com/gpu.present",
		"feature.node.kubernetes.io/pci-0300_10de.present",
		"feature.node.kubernetes.io/pci-0302_10de.present",
		"feature.node.kubernetes.io/pci-10de.present",
	} {
		// Terms are ORed, expressions within a term ANDed: each label
		// must be a term of its own to select a node on its own.
		found := false
		for _, term := range terms {
			if len(term.MatchExpressions) == 1 && term.MatchExpressions[0].Key == label {
				found = true
			}
		}
		if !found {
			t.Errorf("no node selector term matches %s on its own; terms: %+v", label, terms)
		}
	}
}

// The demo's values put the plugin on nodes labelled for simulated GPUs
// and nowhere else. Their affinity must really go: Helm merges an empty map
// with the chart's GPU-node terms, which no demo node matches.
func TestDemoValuesPlaceThePluginOnLabelledNodes(t *testing.T) {
	spec := render(t, "--values", filepath.Join(repoRoot, "deployments", "static", "values-demo.yaml"), "--set-file", simulatedFleet).plugin(t)
	if spec.Affinity != nil {
		t.Errorf("plugin affinity %+v with the demo values, want none", spec.Affinity)
	}
	if spec.NodeSelector["prism.dev/simulated-gpus"] != "true" {
		t.Errorf("plugin nodeSelector %v, want prism.dev/simulated-gpus=true", spec.NodeSelector)
	}
}

func TestPriorityClass(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		// system-node-critical outside kube-system needs a ResourceQuota
		// that allows it; some managed clusters reject it.
		{name: "none by default", want: ""},
		{name: "when asked for", args: []string{"--set", "kubeletPlugin.priorityClassName=system-node-critical"}, want: "system-node-critical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := render(t, tc.args...).plugin(t).PriorityClassName; got != tc.want {
				t.Errorf("plugin priorityClassName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestPluginWaitsForTheDriver(t *testing.T) {
	for _, tc := range []struct {
		name     string
		args     []string
		wantWait bool
	}{
		{name: "real nodes", wantWait: true},
		{name: "driver under the GPU operator's root", args: []string{"--set", "kubeletPlugin.paths.driverRoot=/run/nvidia/driver"}, wantWait: true},
		{name: "simulated fleets have no driver", args: []string{"--set-file", simulatedFleet}},
		{name: "turned off", args: []string{"--set", "kubeletPlugin.driverWait.enabled=false"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := render(t, tc.args...).plugin(t)
			i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "wait-for-driver" })
			if !tc.wantWait {
				if i >= 0 {
					t.Errorf("init container wait-for-driver rendered, want none")
				}
				return
			}
			if i < 0 {
				t.Fatalf("init containers %+v, want wait-for-driver", spec.InitContainers)
			}
			wait := spec.InitContainers[i]
			script := strings.Join(wait.Command, " ")
			if !strings.Contains(script, "libnvidia-ml.so.1") {
				t.Errorf("wait-for-driver does not wait for libnvidia-ml.so.1: %s", script)
			}
			plugin := container(t, spec, "kubelet-plugin")
			var root string
			for _, e := range plugin.Env {
				if e.Name == "NVIDIA_DRIVER_ROOT" {
					root = e.Value
				}
			}
			var env, mounted string
			for _, e := range wait.Env {
				if e.Name == "ROOT" {
					env = e.Value
				}
			}
			for _, m := range wait.VolumeMounts {
				if m.Name == "driver-root" {
					mounted = m.MountPath
				}
			}
			if root == "" || env != root || mounted != root {
				t.Errorf("wait-for-driver looks under %q with the driver root mounted at %q; the plugin's driver root is %q", env, mounted, root)
			}
		})
	}
}

// Where the NVIDIA container runtime is the default, it would hand the
// plugin container GPUs of its own unless told "void".
func TestPluginContainerGetsNoGPUs(t *testing.T) {
	for _, e := range container(t, render(t).plugin(t), "kubelet-plugin").Env {
		if e.Name == "NVIDIA_VISIBLE_DEVICES" {
			if e.Value != "void" {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want void", e.Value)
			}
			return
		}
	}
	t.Error("NVIDIA_VISIBLE_DEVICES is not set on the plugin container")
}

// probeEndpoint is what a plugin probe asks: the httpGet path, or the
// endpoint of an exec probe that runs `prism-kubelet-plugin probe` on the
// probe socket (empty for anything else).
func probeEndpoint(p *corev1.Probe, socket string) string {
	if p == nil {
		return ""
	}
	if p.HTTPGet != nil {
		return p.HTTPGet.Path
	}
	if p.Exec != nil {
		cmd := p.Exec.Command
		if len(cmd) == 4 && cmd[0] == "prism-kubelet-plugin" && cmd[1] == "probe" && cmd[2] == "--socket="+socket {
			return "/" + cmd[3]
		}
	}
	return ""
}

// TestPluginProbes: on the pod network the kubelet asks the HTTP port; on
// the host network, where the two pods of a rolling update would share that
// port, it runs the plugin's exec probe against the pod's own socket.
func TestPluginProbes(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		exec bool
	}{
		{name: "pod network"},
		{name: "host network", args: []string{"--set", "kubeletPlugin.hostNetwork=true"}, exec: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := render(t, tc.args...).plugin(t)
			c := container(t, spec, "kubelet-plugin")
			socket, hasSocket := envValue(c, "PRISM_PROBE_SOCKET")
			if hasSocket != tc.exec {
				t.Errorf("PRISM_PROBE_SOCKET set: %v, want %v", hasSocket, tc.exec)
			}
			if tc.exec {
				for _, p := range []*corev1.Probe{c.StartupProbe, c.LivenessProbe, c.ReadinessProbe} {
					if p == nil || p.Exec == nil {
						t.Fatalf("probe %+v, want an exec probe", p)
					}
				}
				// The socket must be the pod's own: in the emptyDir at /tmp,
				// not on a hostPath the other pod of a surge also mounts.
				i := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/tmp" })
				if !strings.HasPrefix(socket, "/tmp/") || i < 0 {
					t.Fatalf("probe socket %q, /tmp mount %d: want the socket under the pod's /tmp", socket, i)
				}
				j := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[i].Name })
				if j < 0 || spec.Volumes[j].EmptyDir == nil {
					t.Errorf("/tmp is volume %+v, want an emptyDir", spec.Volumes[j])
				}
			}
			if got := probeEndpoint(c.StartupProbe, socket); got != "/readyz" {
				t.Fatalf("startupProbe %+v asks %q, want /readyz", c.StartupProbe.ProbeHandler, got)
			}
			// Start-up covers NVML, registration, publishing and a cluster-wide
			// claim list: at least two minutes before the kubelet gives up.
			if budget := c.StartupProbe.PeriodSeconds * c.StartupProbe.FailureThreshold; budget < 120 {
				t.Errorf("startupProbe allows %ds, want at least 120s", budget)
			}
			if got := probeEndpoint(c.LivenessProbe, socket); got != "/healthz" {
				t.Errorf("livenessProbe %+v asks %q, want /healthz", c.LivenessProbe.ProbeHandler, got)
			}
			if got := probeEndpoint(c.ReadinessProbe, socket); got != "/readyz" {
				t.Errorf("readinessProbe %+v asks %q, want /readyz", c.ReadinessProbe.ProbeHandler, got)
			}
		})
	}
}

func TestControllerProbesAndShutdown(t *testing.T) {
	spec := render(t).controller(t)
	c := container(t, spec, "controller")
	// /readyz waits for the WorkloadProfile cache; /healthz does not.
	if got := httpPath(c.ReadinessProbe); got != "/readyz" {
		t.Errorf("readinessProbe path %q, want /readyz", got)
	}
	if got := httpPath(c.LivenessProbe); got != "/healthz" {
		t.Errorf("livenessProbe path %q, want /healthz", got)
	}
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil || c.Lifecycle.PreStop.Sleep.Seconds < 1 {
		t.Fatalf("controller has no preStop sleep: %+v", c.Lifecycle)
	}
	// The controller lets in-flight reviews run for up to 10s after
	// SIGTERM, which comes after the preStop sleep.
	const drain = 10
	if spec.TerminationGracePeriodSeconds == nil || *spec.TerminationGracePeriodSeconds < c.Lifecycle.PreStop.Sleep.Seconds+drain {
		t.Errorf("terminationGracePeriodSeconds %v does not cover the %ds preStop sleep plus the %ds drain", spec.TerminationGracePeriodSeconds, c.Lifecycle.PreStop.Sleep.Seconds, drain)
	}
}

func TestImageTagFollowsAppVersion(t *testing.T) {
	chart, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var meta struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(chart, &meta); err != nil {
		t.Fatal(err)
	}
	r := render(t)
	// The names `make images` gives its archives (hack/tools/imagebuild);
	// the driver wait's shell comes from the plugin image's busybox, so no
	// other image is pulled.
	plugin, controller := r.plugin(t), r.controller(t)
	images := map[string]string{}
	for _, c := range slices.Concat(plugin.InitContainers, plugin.Containers, controller.Containers) {
		images[c.Name] = c.Image
	}
	pluginImage := "ghcr.io/prismgpu/prism-kubelet-plugin:" + meta.AppVersion
	for name, want := range map[string]string{
		"kubelet-plugin":   pluginImage,
		"install-cdi-hook": pluginImage,
		"wait-for-driver":  pluginImage,
		"controller":       "ghcr.io/prismgpu/prism-controller:" + meta.AppVersion,
	} {
		if images[name] != want {
			t.Errorf("container %s image %q, want %q", name, images[name], want)
		}
	}
}

func TestGrafanaDashboard(t *testing.T) {
	const name = "prism-grafana-dashboard"
	if _, ok := render(t).configMaps[name]; ok {
		t.Errorf("ConfigMap %s rendered by default; the dashboard is opt-in", name)
	}
	cm, ok := render(t, "--set", "metrics.grafanaDashboard.enabled=true").configMaps[name]
	if !ok {
		t.Fatalf("no ConfigMap %s with metrics.grafanaDashboard.enabled", name)
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v lack grafana_dashboard=1, which the Grafana sidecar selects by", cm.Labels)
	}
	var dashboard struct {
		UID    string            `json:"uid"`
		Panels []json.RawMessage `json:"panels"`
	}
	if err := json.Unmarshal([]byte(cm.Data["prism.json"]), &dashboard); err != nil {
		t.Fatalf("prism.json is not a JSON dashboard: %v", err)
	}
	if dashboard.UID == "" || len(dashboard.Panels) == 0 {
		t.Errorf("dashboard has uid %q and %d panels", dashboard.UID, len(dashboard.Panels))
	}
}

// The container runtime reads CDI specs on the host, so the plugin must be
// told where the driver root and nvidia-cdi-hook are there, and the hook
// must be put there.
func TestPluginNamesHostPathsInCDISpecs(t *testing.T) {
	for _, tc := range []struct {
		name, driverRoot, stateDir string
	}{
		{name: "host-installed driver", driverRoot: "/", stateDir: "/var/lib/prism"},
		{name: "GPU operator driver, own state dir", driverRoot: "/run/nvidia/driver", stateDir: "/srv/prism"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := render(t, "--set", "kubeletPlugin.paths.driverRoot="+tc.driverRoot, "--set", "kubeletPlugin.paths.stateDir="+tc.stateDir).plugin(t)
			env := map[string]string{}
			for _, e := range container(t, spec, "kubelet-plugin").Env {
				env[e.Name] = e.Value
			}
			hook := tc.stateDir + "/bin/nvidia-cdi-hook"
			if env["PRISM_HOST_DRIVER_ROOT"] != tc.driverRoot || env["PRISM_NVIDIA_CDI_HOOK_PATH"] != hook {
				t.Errorf("PRISM_HOST_DRIVER_ROOT=%q PRISM_NVIDIA_CDI_HOOK_PATH=%q, want %q and %q",
					env["PRISM_HOST_DRIVER_ROOT"], env["PRISM_NVIDIA_CDI_HOOK_PATH"], tc.driverRoot, hook)
			}
			i := slices.IndexFunc(spec.InitContainers, func(c corev1.Container) bool { return c.Name == "install-cdi-hook" })
			if i < 0 {
				t.Fatalf("no install-cdi-hook init container")
			}
			install := spec.InitContainers[i]
			if len(install.Env) != 1 || install.Env[0].Value != hook {
				t.Errorf("install-cdi-hook env %+v, want HOOK=%s", install.Env, hook)
			}
			if len(install.VolumeMounts) != 1 || install.VolumeMounts[0].Name != "state" || install.VolumeMounts[0].MountPath != tc.stateDir {
				t.Errorf("install-cdi-hook mounts %+v, want the state dir at its host path %s", install.VolumeMounts, tc.stateDir)
			}
		})
	}
}
