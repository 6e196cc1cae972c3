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
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/prismgpu/prism/internal/controller/servingcert/certtest"
)

// networkPolicies renders the chart and returns its NetworkPolicies by name.
func networkPolicies(t *testing.T, args ...string) map[string]*networkingv1.NetworkPolicy {
	t.Helper()
	return objectsOfKind[networkingv1.NetworkPolicy](t, mustTemplate(t, args...), "NetworkPolicy")
}

func tcpPort(port int) networkingv1.NetworkPolicyPort {
	protocol, p := corev1.ProtocolTCP, intstr.FromInt32(int32(port))
	return networkingv1.NetworkPolicyPort{Protocol: &protocol, Port: &p}
}

// The controller pods take traffic on the webhook port and the HTTP port
// only; sources are open unless webhookFrom names them, since the API
// server is often on the host network. The policy can be turned off, and
// is not rendered on the host network, where it would not apply.
func TestControllerNetworkPolicy(t *testing.T) {
	controlPlane := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "10.0.0.0/24"}}
	for _, tc := range []struct {
		name string
		args []string
		want []networkingv1.NetworkPolicyIngressRule // nil: no policy
	}{{
		name: "default",
		want: []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(9443)}},
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(8080)}},
		},
	}, {
		name: "ports follow the values",
		args: []string{"--set", "webhook.port=8443", "--set", "controller.httpPort=9090"},
		want: []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(8443)}},
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(9090)}},
		},
	}, {
		name: "webhook sources named",
		args: []string{"--set-json", `controller.networkPolicy.webhookFrom=[{"ipBlock":{"cidr":"10.0.0.0/24"}}]`},
		want: []networkingv1.NetworkPolicyIngressRule{
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(9443)}, From: []networkingv1.NetworkPolicyPeer{controlPlane}},
			{Ports: []networkingv1.NetworkPolicyPort{tcpPort(8080)}},
		},
	}, {
		name: "turned off",
		args: []string{"--set", "controller.networkPolicy.enabled=false"},
	}, {
		name: "host network",
		args: []string{"--set", "controller.hostNetwork=true"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			policies := networkPolicies(t, tc.args...)
			p, ok := policies["prism-controller"]
			if tc.want == nil {
				if len(policies) != 0 {
					t.Errorf("NetworkPolicies %v rendered, want none", slices.Sorted(maps.Keys(policies)))
				}
				return
			}
			if !ok || len(policies) != 1 {
				t.Fatalf("NetworkPolicies %v rendered, want prism-controller alone", slices.Sorted(maps.Keys(policies)))
			}
			if diff := cmp.Diff(tc.want, p.Spec.Ingress); diff != "" {
				t.Errorf("ingress rules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]networkingv1.PolicyType{networkingv1.PolicyTypeIngress}, p.Spec.PolicyTypes); diff != "" {
				t.Errorf("policy types (-want +got): egress to the API server must stay open\n%s", diff)
			}
			d := render(t, tc.args...).deployments["prism-controller"]
			if diff := cmp.Diff(d.Spec.Selector.MatchLabels, p.Spec.PodSelector.MatchLabels); diff != "" {
				t.Errorf("pod selector (-controller's +policy's):\n%s", diff)
			}
		})
	}
}

// testCAFile writes a CA certificate in PEM and returns its path.
func testCAFile(t *testing.T) (path, pemText string) {
	t.Helper()
	pemText = string(certtest.NewCA(t, "webhook client CA").PEM())
	path = filepath.Join(t.TempDir(), "client-ca.crt")
	if err := os.WriteFile(path, []byte(pemText), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, pemText
}

// webhook.clientCA reaches the controller as --client-ca-file, a file of a
// ConfigMap the chart renders, mounted where the flag points. Unset, the
// controller asks no client for a certificate.
func TestWebhookClientCA(t *testing.T) {
	path, pemText := testCAFile(t)
	for _, tc := range []struct {
		name string
		args []string
		want bool
	}{
		{"unset", nil, false},
		{"set", []string{"--set-file", "webhook.clientCA=" + path}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, tc.args...)
			spec := r.controller(t)
			c := container(t, spec, "controller")
			i := slices.IndexFunc(c.Args, func(a string) bool { return strings.HasPrefix(a, "--client-ca-file=") })
			cm, rendered := r.configMaps["prism-controller-client-ca"]
			if (i >= 0) != tc.want || rendered != tc.want {
				t.Fatalf("--client-ca-file in %v: %v, its ConfigMap rendered: %v; want %v", c.Args, i >= 0, rendered, tc.want)
			}
			if !tc.want {
				return
			}
			if diff := cmp.Diff(strings.TrimSpace(pemText)+"\n", cm.Data["ca.crt"]); diff != "" {
				t.Errorf("ConfigMap's ca.crt (-want +got):\n%s", diff)
			}
			file := strings.TrimPrefix(c.Args[i], "--client-ca-file=")
			m := slices.IndexFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == filepath.Dir(file) })
			if m < 0 || !c.VolumeMounts[m].ReadOnly || c.VolumeMounts[m].SubPath != "" {
				t.Fatalf("no read-only mount of a whole volume at %s, where --client-ca-file points: %+v", filepath.Dir(file), c.VolumeMounts)
			}
			v := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == c.VolumeMounts[m].Name })
			if v < 0 || spec.Volumes[v].ConfigMap == nil || spec.Volumes[v].ConfigMap.Name != "prism-controller-client-ca" || filepath.Base(file) != "ca.crt" {
				t.Errorf("%s is not ca.crt of ConfigMap prism-controller-client-ca: volumes %+v", file, spec.Volumes)
			}
		})
	}
}

// A value that holds no certificate is refused at install, not found out
// when every review fails.
func TestWebhookClientCAMustBePEM(t *testing.T) {
	_, stderr, err := helmTemplate(t, "--set", "webhook.clientCA=my-ca")
	if err == nil || !strings.Contains(stderr, "clientCA") {
		t.Errorf("helm template with webhook.clientCA=my-ca: %v (%s), want a refusal naming clientCA", err, strings.TrimSpace(stderr))
	}
}
