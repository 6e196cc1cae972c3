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

package chart

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// schedulerObjects are the objects of the chart's scheduler component
// (app.kubernetes.io/component=scheduler), by "Kind namespace/name".
func schedulerObjects(t *testing.T, args ...string) map[string][]byte {
	t.Helper()
	objs := map[string][]byte{}
	eachObject(t, mustTemplate(t, args...), func(kind string, doc []byte) {
		var meta struct {
			Metadata struct {
				Name, Namespace string
				Labels          map[string]string
			}
		}
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("decode rendered %s: %v\n%s", kind, err, doc)
		}
		if meta.Metadata.Labels["app.kubernetes.io/component"] == "scheduler" {
			objs[kind+" "+meta.Metadata.Namespace+"/"+meta.Metadata.Name] = doc
		}
	})
	return objs
}

func decodeObject[T any](t *testing.T, objs map[string][]byte, key string) *T {
	t.Helper()
	doc, ok := objs[key]
	if !ok {
		var have []string
		for k := range objs {
			have = append(have, k)
		}
		slices.Sort(have)
		t.Fatalf("no %s rendered; scheduler objects: %v", key, have)
	}
	obj := new(T)
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		t.Fatalf("decode %s: %v\n%s", key, err, doc)
	}
	return obj
}

// schedulerConfig is the part of KubeSchedulerConfiguration v1 the chart
// writes; strict decoding fails on any other field.
type schedulerConfig struct {
	APIVersion       string `json:"apiVersion"`
	Kind             string `json:"kind"`
	ClientConnection *struct {
		Kubeconfig string `json:"kubeconfig"`
	} `json:"clientConnection"`
	LeaderElection struct {
		LeaderElect       bool   `json:"leaderElect"`
		ResourceLock      string `json:"resourceLock"`
		ResourceName      string `json:"resourceName"`
		ResourceNamespace string `json:"resourceNamespace"`
	} `json:"leaderElection"`
	Profiles []struct {
		SchedulerName string           `json:"schedulerName"`
		Plugins       map[string]any   `json:"plugins"`
		PluginConfig  []map[string]any `json:"pluginConfig"`
	} `json:"profiles"`
}

// renderedScheduler is what the chart renders for prism-scheduler.
type renderedScheduler struct {
	objs       map[string][]byte
	config     schedulerConfig
	deployment *appsv1.Deployment
	spec       *corev1.PodSpec
	container  *corev1.Container
}

func renderScheduler(t *testing.T, args ...string) renderedScheduler {
	t.Helper()
	r := renderedScheduler{objs: schedulerObjects(t, append([]string{"--set", "scheduler.enabled=true"}, args...)...)}
	cm := decodeObject[corev1.ConfigMap](t, r.objs, "ConfigMap prism-system/prism-scheduler")
	if err := yaml.UnmarshalStrict([]byte(cm.Data["config.yaml"]), &r.config); err != nil {
		t.Fatalf("decode the KubeSchedulerConfiguration: %v\n%s", err, cm.Data["config.yaml"])
	}
	r.deployment = decodeObject[appsv1.Deployment](t, r.objs, "Deployment prism-system/prism-scheduler")
	r.spec = &r.deployment.Spec.Template.Spec
	r.container = container(t, r.spec, "scheduler")
	return r
}

func TestSchedulerIsOffByDefault(t *testing.T) {
	for key := range schedulerObjects(t) {
		t.Errorf("default values render %s", key)
	}
}

// appVersion is the chart's appVersion, the images' default tag.
func appVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml's appVersion: %q, %v", chart.AppVersion, err)
	}
	return chart.AppVersion
}

func TestSchedulerDefaults(t *testing.T) {
	r := renderScheduler(t)

	t.Run("configuration", func(t *testing.T) {
		c := r.config
		if c.APIVersion != "kubescheduler.config.k8s.io/v1" || c.Kind != "KubeSchedulerConfiguration" {
			t.Errorf("config is %s %s", c.APIVersion, c.Kind)
		}
		if len(c.Profiles) != 1 || c.Profiles[0].SchedulerName != "prism-scheduler" {
			t.Fatalf("profiles %+v, want one named prism-scheduler", c.Profiles)
		}
		// The stock plugin set: naming a default plugin would re-weight it.
		if c.Profiles[0].Plugins != nil || c.Profiles[0].PluginConfig != nil {
			t.Errorf("profile overrides plugins %v / pluginConfig %v, want the stock set", c.Profiles[0].Plugins, c.Profiles[0].PluginConfig)
		}
		le := c.LeaderElection
		if !le.LeaderElect || le.ResourceLock != "leases" || le.ResourceName != "prism-scheduler" || le.ResourceNamespace != "prism-system" {
			t.Errorf("leader election %+v, want Lease prism-system/prism-scheduler", le)
		}
		if c.ClientConnection != nil {
			t.Errorf("clientConnection %+v without kubeconfigSecret, want the in-cluster configuration", c.ClientConnection)
		}
	})

	t.Run("deployment", func(t *testing.T) {
		c, spec := r.container, r.spec
		if c.Image != "ghcr.io/prismgpu/prism-scheduler:"+appVersion(t) {
			t.Errorf("image %s", c.Image)
		}
		if !slices.Equal(c.Command, []string{"prism-scheduler"}) {
			t.Errorf("command %v", c.Command)
		}
		for _, want := range []string{"--config=/etc/prism-scheduler/config.yaml", "--secure-port=10269", "-v=2"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("args %v lack %s", c.Args, want)
			}
		}
		for _, a := range c.Args {
			if strings.HasPrefix(a, "--bind-address") || strings.HasPrefix(a, "--authentication-kubeconfig") {
				t.Errorf("arg %s without the air-gap options", a)
			}
		}
		// The ConfigMap is mounted where --config points.
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool {
			return v.ConfigMap != nil && v.ConfigMap.Name == "prism-scheduler"
		})
		if i < 0 {
			t.Fatalf("no volume of ConfigMap prism-scheduler")
		}
		if j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == spec.Volumes[i].Name }); j < 0 || c.VolumeMounts[j].MountPath != "/etc/prism-scheduler" {
			t.Errorf("config volume mounts %+v, want /etc/prism-scheduler", c.VolumeMounts)
		}
		if r.deployment.Spec.Template.Annotations["checksum/config"] == "" {
			t.Error("no checksum/config annotation: a changed configuration would not restart the scheduler")
		}
		if len(c.Ports) != 1 || c.Ports[0].Name != "https" || c.Ports[0].ContainerPort != 10269 {
			t.Errorf("ports %+v, want https 10269", c.Ports)
		}
		for what, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			want := map[string]string{"liveness": "/livez", "readiness": "/readyz"}[what]
			if p == nil || p.HTTPGet == nil || p.HTTPGet.Scheme != corev1.URISchemeHTTPS || p.HTTPGet.Port != intstr.FromString("https") || p.HTTPGet.Path != want || p.HTTPGet.Host != "" {
				t.Errorf("%s probe %+v, want HTTPS %s on port https", what, p, want)
			}
		}
		psc := spec.SecurityContext
		if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser != 65532 {
			t.Errorf("pod securityContext %+v, want non-root 65532", psc)
		}
		if sc := c.SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("container securityContext %+v", sc)
		}
		if spec.HostNetwork {
			t.Error("on the host network by default")
		}
		if *r.deployment.Spec.Replicas != 1 || spec.Affinity != nil {
			t.Errorf("replicas %d, affinity %+v; want 1 and none", *r.deployment.Spec.Replicas, spec.Affinity)
		}
		if _, ok := r.objs["PodDisruptionBudget prism-system/prism-scheduler"]; ok {
			t.Error("a PodDisruptionBudget for one replica")
		}
		if spec.ServiceAccountName != "prism-scheduler" {
			t.Errorf("serviceAccountName %q", spec.ServiceAccountName)
		}
		decodeObject[corev1.ServiceAccount](t, r.objs, "ServiceAccount prism-system/prism-scheduler")
	})

	t.Run("RBAC", func(t *testing.T) {
		sa := rbacv1.Subject{Kind: "ServiceAccount", Name: "prism-scheduler", Namespace: "prism-system"}
		for _, role := range []string{"system:kube-scheduler", "system:volume-scheduler"} {
			name := "ClusterRoleBinding /prism-scheduler-" + strings.TrimPrefix(role, "system:")
			b := decodeObject[rbacv1.ClusterRoleBinding](t, r.objs, name)
			if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != role || !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
				t.Errorf("%s binds %+v to %+v, want %s to the scheduler's ServiceAccount", name, b.RoleRef, b.Subjects, role)
			}
		}
		role := decodeObject[rbacv1.Role](t, r.objs, "Role prism-system/prism-scheduler")
		want := []rbacv1.PolicyRule{{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{"prism-scheduler"}, Verbs: []string{"get", "update", "list", "watch"}}}
		if len(role.Rules) != 1 || !slices.Equal(role.Rules[0].ResourceNames, want[0].ResourceNames) || !slices.Equal(role.Rules[0].Verbs, want[0].Verbs) || !slices.Equal(role.Rules[0].Resources, want[0].Resources) {
			t.Errorf("Role rules %+v, want %+v", role.Rules, want)
		}
		for key, ref := range map[string]string{
			"RoleBinding prism-system/prism-scheduler":            "prism-scheduler",
			"RoleBinding kube-system/prism-scheduler-auth-reader": "extension-apiserver-authentication-reader",
		} {
			b := decodeObject[rbacv1.RoleBinding](t, r.objs, key)
			if b.RoleRef.Kind != "Role" || b.RoleRef.Name != ref || !slices.Equal(b.Subjects, []rbacv1.Subject{sa}) {
				t.Errorf("%s binds %+v to %+v, want Role %s", key, b.RoleRef, b.Subjects, ref)
			}
		}
	})
}

func TestSchedulerTestAndAirGapOptions(t *testing.T) {
	r := renderScheduler(t, "--set", "scheduler.hostNetwork=true", "--set", "scheduler.kubeconfigSecret=scheduler-kubeconfig", "--set", "scheduler.securePort=18259")
	c, spec := r.container, r.spec
	if !spec.HostNetwork {
		t.Error("scheduler pods are not on the host network")
	}
	checkLoopbackProbes(t, c)
	// kube-scheduler does not read KUBECONFIG: the configuration and the
	// secure port's delegation flags name the mounted file.
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool {
		return v.Secret != nil && v.Secret.SecretName == "scheduler-kubeconfig"
	})
	if i < 0 {
		t.Fatalf("no volume of Secret scheduler-kubeconfig")
	}
	vol := spec.Volumes[i]
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == vol.Name })
	if j < 0 || !c.VolumeMounts[j].ReadOnly || len(vol.Secret.Items) != 1 || vol.Secret.Items[0].Key != "kubeconfig" {
		t.Fatalf("Secret volume %+v mounted as %+v, want key kubeconfig read-only", vol, c.VolumeMounts)
	}
	path := c.VolumeMounts[j].MountPath + "/" + vol.Secret.Items[0].Path
	if r.config.ClientConnection == nil || r.config.ClientConnection.Kubeconfig != path {
		t.Errorf("clientConnection %+v, want kubeconfig %s", r.config.ClientConnection, path)
	}
	for _, want := range []string{"--bind-address=127.0.0.1", "--secure-port=18259", "--authentication-kubeconfig=" + path, "--authorization-kubeconfig=" + path} {
		if !slices.Contains(c.Args, want) {
			t.Errorf("args %v lack %s", c.Args, want)
		}
	}
	if c.Ports[0].ContainerPort != 18259 {
		t.Errorf("container port %d, want 18259", c.Ports[0].ContainerPort)
	}
	ru := r.deployment.Spec.Strategy.RollingUpdate
	if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(0) {
		t.Errorf("update strategy %+v, want no surge", ru)
	}
}

func TestSchedulerValues(t *testing.T) {
	r := renderScheduler(t,
		"--set", "scheduler.schedulerName=gpu-scheduler",
		"--set", "scheduler.leaderElection.leaseName=gpu-scheduler-lease",
		"--set", "scheduler.replicas=2",
		"--set", "scheduler.nodeSelector.role=infra",
		"--set", "scheduler.tolerations[0].key=infra,scheduler.tolerations[0].operator=Exists",
		"--set", "scheduler.pluginConfig[0].name=DynamicResources,scheduler.pluginConfig[0].args.filterTimeout=20s",
		"--set", "scheduler.logVerbosity=4",
		"--set", "image.schedulerDigest=sha256:"+strings.Repeat("ab", 32),
	)
	if p := r.config.Profiles; len(p) != 1 || p[0].SchedulerName != "gpu-scheduler" || len(p[0].PluginConfig) != 1 || p[0].PluginConfig[0]["name"] != "DynamicResources" {
		t.Errorf("profiles %+v, want gpu-scheduler with the DynamicResources pluginConfig", p)
	}
	if le := r.config.LeaderElection; le.ResourceName != "gpu-scheduler-lease" {
		t.Errorf("lease %s, want gpu-scheduler-lease", le.ResourceName)
	}
	role := decodeObject[rbacv1.Role](t, r.objs, "Role prism-system/prism-scheduler")
	if !slices.Equal(role.Rules[0].ResourceNames, []string{"gpu-scheduler-lease"}) {
		t.Errorf("Role covers Leases %v, want gpu-scheduler-lease", role.Rules[0].ResourceNames)
	}
	if r.spec.NodeSelector["role"] != "infra" || len(r.spec.Tolerations) != 1 || r.spec.Tolerations[0].Key != "infra" {
		t.Errorf("nodeSelector %v, tolerations %+v", r.spec.NodeSelector, r.spec.Tolerations)
	}
	if r.spec.Affinity == nil || r.spec.Affinity.PodAntiAffinity == nil {
		t.Errorf("two replicas without a spread over nodes: %+v", r.spec.Affinity)
	}
	pdb := decodeObject[policyv1.PodDisruptionBudget](t, r.objs, "PodDisruptionBudget prism-system/prism-scheduler")
	if pdb.Spec.MinAvailable == nil || pdb.Spec.MinAvailable.IntValue() != 1 {
		t.Errorf("PodDisruptionBudget minAvailable %v, want 1", pdb.Spec.MinAvailable)
	}
	if want := "ghcr.io/prismgpu/prism-scheduler@sha256:" + strings.Repeat("ab", 32); r.container.Image != want {
		t.Errorf("image %s, want %s", r.container.Image, want)
	}
	if !slices.Contains(r.container.Args, "-v=4") {
		t.Errorf("args %v lack -v=4", r.container.Args)
	}
}

// The stock scheduler keeps its name and its Lease.
func TestSchedulerRefusesTheStockSchedulersNames(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "scheduler.enabled=true", "--set", "scheduler.schedulerName=default-scheduler"}, "scheduler.schedulerName must not be default-scheduler"},
		{[]string{"--set", "scheduler.enabled=true", "--set", "scheduler.leaderElection.leaseName=kube-scheduler", "--namespace", "kube-system"}, "leaseName must not be kube-scheduler in kube-system"},
	} {
		if _, stderr, err := helmTemplate(t, tc.args...); err == nil || !strings.Contains(stderr, tc.want) {
			t.Errorf("helm template %v: %v (%s), want a refusal saying %q", tc.args, err, strings.TrimSpace(stderr), tc.want)
		}
	}
	// The same lease name elsewhere is another Lease.
	if _, stderr, err := helmTemplate(t, "--set", "scheduler.enabled=true", "--set", "scheduler.leaderElection.leaseName=kube-scheduler"); err != nil {
		t.Errorf("Lease kube-scheduler in prism-system refused: %v\n%s", err, stderr)
	}
}
