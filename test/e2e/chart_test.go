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
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/test/testbed"
)

// TestChartLintsAndDryRuns lints the Helm chart and applies what it renders
// to the test bed's API server with a server-side dry run, so that a field
// the API rejects fails here rather than at a user's helm install.
func TestChartLintsAndDryRuns(t *testing.T) {
	ctx, cluster := testbed.ForTest(t, testbed.Options{})
	rendered := filepath.Join(t.TempDir(), "prism.yaml")
	check := exec.CommandContext(ctx, filepath.Join(repoRoot, "hack", "helm-check.sh"), rendered)
	check.Env = append(os.Environ(), "HELM="+cluster.BinPath("helm"))
	check.Dir = repoRoot
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("hack/helm-check.sh: %v\n%s", err, out)
	}
	// A dry run of namespaced objects needs their namespace to exist.
	if _, err := cluster.Client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "prism-system"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := testbed.Kubectl(context.Background(), cluster, "apply", "--dry-run=server", "--validate=strict", "-f", rendered)
	if err != nil {
		t.Fatalf("server-side dry run of the chart: %v\n%s", err, out)
	}
	for _, kind := range []string{"daemonset.apps/", "deployment.apps/", "deviceclass.resource.k8s.io/gpu.prism.dev", "mutatingwebhookconfiguration.admissionregistration.k8s.io/prism-rewrite", "customresourcedefinition.apiextensions.k8s.io/workloadprofiles.prism.dev"} {
		if !strings.Contains(out, kind) {
			t.Errorf("dry run did not include %s:\n%s", kind, out)
		}
	}
}
