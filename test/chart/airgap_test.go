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
	"slices"
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// airGapArgs switch on every test and air-gap option, as the helm e2e test
// (test/e2e/helm_test.go) installs the chart on the test bed.
var airGapArgs = []string{
	"--set", "kubeletPlugin.hostNetwork=true",
	"--set", "kubeletPlugin.kubeconfigSecret=plugin-kubeconfig",
	"--set", "kubeletPlugin.httpPort=18080",
	"--set", "controller.hostNetwork=true",
	"--set", "controller.kubeconfigSecret=controller-kubeconfig",
	"--set", "controller.httpPort=18081",
	"--set", "webhook.url.enabled=true",
	"--set", "webhook.port=18443",
}

// envValue is the value of a plain variable, and whether it is set.
func envValue(c *corev1.Container, name string) (string, bool) {
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == name })
	if i < 0 {
		return "", false
	}
	return c.Env[i].Value, true
}

// hostNetworkContainer returns the named container of a pod that must be on
// the host network and reach the API server through a kubeconfig Secret.
func hostNetworkContainer(t *testing.T, spec *corev1.PodSpec, name, kubeconfigSecret string) *corev1.Container {
	t.Helper()
	c := container(t, spec, name)
	if !spec.HostNetwork {
		t.Errorf("%s pods are not on the host network", name)
	}
	checkKubeconfig(t, spec, c, kubeconfigSecret)
	return c
}

// checkKubeconfig: the Secret is mounted read-only where KUBECONFIG points.
func checkKubeconfig(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, secret string) {
	t.Helper()
	path, ok := envValue(c, "KUBECONFIG")
	if !ok {
		t.Fatalf("%s: KUBECONFIG not set", c.Name)
	}
	i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Secret != nil && v.Secret.SecretName == secret })
	if i < 0 {
		t.Fatalf("%s: no volume of Secret %s", c.Name, secret)
	}
	vol := spec.Volumes[i]
	if len(vol.Secret.Items) != 1 || vol.Secret.Items[0].Key != "kubeconfig" {
		t.Errorf("%s: Secret volume items %+v, want key kubeconfig", c.Name, vol.Secret.Items)
	}
	j := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == vol.Name })
	if j < 0 {
		t.Fatalf("%s: Secret volume %s not mounted", c.Name, vol.Name)
	}
	m := c.VolumeMounts[j]
	if !m.ReadOnly || path != m.MountPath+"/"+vol.Secret.Items[0].Path {
		t.Errorf("%s: KUBECONFIG=%s, Secret mounted at %s (read-only %v)", c.Name, path, m.MountPath, m.ReadOnly)
	}
}

// checkLoopbackProbes: on the host network the pod IP is the node's address,
// which the kubelet must not be sent to; probes ask loopback, where the
// binary listens.
func checkLoopbackProbes(t *testing.T, c *corev1.Container) {
	t.Helper()
	for what, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil {
			continue
		}
		if p.HTTPGet == nil || p.HTTPGet.Host != "127.0.0.1" {
			t.Errorf("%s: %s probe %+v, want an httpGet to 127.0.0.1", c.Name, what, p.ProbeHandler)
		}
	}
}

func TestTestAndAirGapOptions(t *testing.T) {
	r := render(t, append([]string{"--set-file", simulatedFleet}, airGapArgs...)...)

	t.Run("plugin", func(t *testing.T) {
		c := hostNetworkContainer(t, r.plugin(t), "kubelet-plugin", "plugin-kubeconfig")
		// The probes exec the plugin against its own socket (TestPluginProbes):
		// the kubelet never reaches for the node's address.
		for what, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
			if p == nil || p.Exec == nil {
				t.Errorf("%s probe %+v, want an exec probe", what, p)
			}
		}
		if got, _ := envValue(c, "PRISM_HTTP_ADDRESS"); got != "127.0.0.1:18080" {
			t.Errorf("PRISM_HTTP_ADDRESS=%q, want 127.0.0.1:18080", got)
		}
		// A container port would be a hostPort here, which the scheduler
		// gives one pod per node: the surge pod would stay Pending.
		if len(c.Ports) != 0 {
			t.Errorf("plugin container ports %+v, want none on the host network", c.Ports)
		}
		// The two pods of a surge no longer collide: the values' surge holds.
		ru := r.daemonSets["prism-kubelet-plugin"].Spec.UpdateStrategy.RollingUpdate
		if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(1) || ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(0) {
			t.Errorf("rolling update %+v, want the default maxSurge 1, maxUnavailable 0", ru)
		}
	})

	t.Run("plugin rolling update from values", func(t *testing.T) {
		r := render(t, append([]string{"--set-file", simulatedFleet, "--set", "kubeletPlugin.rollingUpdate.maxSurge=0", "--set", "kubeletPlugin.rollingUpdate.maxUnavailable=1"}, airGapArgs...)...)
		ru := r.daemonSets["prism-kubelet-plugin"].Spec.UpdateStrategy.RollingUpdate
		if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(0) || ru.MaxUnavailable == nil || *ru.MaxUnavailable != intstr.FromInt32(1) {
			t.Errorf("rolling update %+v, want the values' maxSurge 0, maxUnavailable 1", ru)
		}
	})

	t.Run("controller", func(t *testing.T) {
		c := hostNetworkContainer(t, r.controller(t), "controller", "controller-kubeconfig")
		checkLoopbackProbes(t, c)
		for _, want := range []string{"--webhook-port=18443", "--webhook-host=127.0.0.1", "--extra-sans=127.0.0.1", "--http-address=127.0.0.1:18081", "--self-signed=true"} {
			if !slices.Contains(c.Args, want) {
				t.Errorf("controller args %v lack %s", c.Args, want)
			}
		}
		ru := r.deployments["prism-controller"].Spec.Strategy.RollingUpdate
		if ru == nil || ru.MaxSurge == nil || *ru.MaxSurge != intstr.FromInt32(0) {
			t.Errorf("controller update strategy %+v, want no surge", ru)
		}
	})

	t.Run("webhooks by URL", func(t *testing.T) {
		var configs []admissionregistrationv1.WebhookClientConfig
		var names []string
		for _, w := range r.mutating["prism-rewrite"].Webhooks {
			configs, names = append(configs, w.ClientConfig), append(names, w.Name)
		}
		for _, w := range r.validating["prism-validate"].Webhooks {
			configs, names = append(configs, w.ClientConfig), append(names, w.Name)
		}
		if len(configs) != 4 {
			t.Fatalf("want the four webhooks, got %v", names)
		}
		for i, cc := range configs {
			if cc.Service != nil || cc.URL == nil || !strings.HasPrefix(*cc.URL, "https://127.0.0.1:18443/") {
				t.Errorf("webhook %s: client config %+v, want a URL on https://127.0.0.1:18443", names[i], cc)
			}
		}
	})
}

// Off by default: an ordinary install uses the pod network, in-cluster
// credentials and the Service.
func TestTestAndAirGapOptionsAreOffByDefault(t *testing.T) {
	r := render(t)
	for name, spec := range map[string]*corev1.PodSpec{"plugin": r.plugin(t), "controller": r.controller(t)} {
		if spec.HostNetwork {
			t.Errorf("%s: on the host network by default", name)
		}
		for _, c := range spec.Containers {
			if _, ok := envValue(&c, "KUBECONFIG"); ok {
				t.Errorf("%s: KUBECONFIG set by default", name)
			}
		}
	}
	for _, w := range r.mutating["prism-rewrite"].Webhooks {
		if w.ClientConfig.Service == nil || w.ClientConfig.URL != nil {
			t.Errorf("webhook %s: client config %+v, want the Service", w.Name, w.ClientConfig)
		}
	}
}

func TestWebhookURLOptionRefusals(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"cert-manager names the Service", []string{"--set", "webhook.url.enabled=true", "--set", "webhook.certManager.enabled=true"}, "webhook.url.enabled needs the controller's self-signed certificate"},
		{"host with a path", []string{"--set", "webhook.url.enabled=true", "--set", "webhook.url.host=example.com/x"}, "/webhook/url/host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helmTemplate(t, tc.args...)
			if err == nil || !strings.Contains(stderr, tc.want) {
				t.Errorf("helm template %v: err %v, stderr %q; want a refusal naming %q", tc.args, err, stderr, tc.want)
			}
		})
	}
}

// An IPv6 host is bracketed in the URL.
func TestWebhookURLWithIPv6Host(t *testing.T) {
	r := render(t, "--set", "webhook.url.enabled=true", "--set", "webhook.url.host=::1")
	for _, w := range r.mutating["prism-rewrite"].Webhooks {
		if w.ClientConfig.URL == nil || !strings.HasPrefix(*w.ClientConfig.URL, "https://[::1]:9443/") {
			t.Errorf("webhook %s: URL %v, want https://[::1]:9443/...", w.Name, w.ClientConfig.URL)
		}
	}
}
