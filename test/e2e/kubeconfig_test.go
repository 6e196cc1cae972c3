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
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/test/testbed"
)

// createKubeconfigSecret stores a kubeconfig of the ServiceAccount (a
// TokenRequest token, bound to a stand-in pod on node unless node is empty;
// the API server on loopback) in a Secret of the release namespace, key
// kubeconfig, as the chart's kubeconfigSecret options read it.
func createKubeconfigSecret(ctx context.Context, t *testing.T, c *testbed.Cluster, secret, serviceAccount, node string) {
	t.Helper()
	path, err := c.ServiceAccountKubeconfig(ctx, bed.Namespace, serviceAccount, node)
	if err != nil {
		t.Fatal(err)
	}
	data := mustReadFile(t, path)
	_, err = c.Client.CoreV1().Secrets(bed.Namespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret},
		Data:       map[string][]byte{"kubeconfig": data},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Secret %s: %v", secret, err)
	}
}
