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

package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
)

// tokenLifetime outlives any test and a working day of the demo daemon; the
// test bed never rotates tokens.
const tokenLifetime = 48 * 60 * 60

// ServiceAccountKubeconfig writes a kubeconfig that authenticates as the
// ServiceAccount namespace/name with a token from the TokenRequest API, so a
// component run with it has exactly the permissions RBAC grants that
// account. When node is not empty the token is bound to a stand-in pod on
// that node: like the token of a DaemonSet pod on a real node, it then
// carries the node's name in the user extra
// authentication.kubernetes.io/node-name, which admission policies check.
func (c *Cluster) ServiceAccountKubeconfig(ctx context.Context, namespace, name, node string) (string, error) {
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](tokenLifetime)}}
	file := name
	if node != "" {
		pod, err := c.standInPod(ctx, namespace, name, node)
		if err != nil {
			return "", err
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
		file = pod.Name
	}
	tok, err := c.Client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("request a token for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testbed"] = &clientcmdapi.Cluster{Server: c.Config.Host, CertificateAuthorityData: c.Config.CAData}
	cfg.AuthInfos[name] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	cfg.Contexts["default"] = &clientcmdapi.Context{Cluster: "testbed", AuthInfo: name, Namespace: namespace}
	cfg.CurrentContext = "default"
	dir := filepath.Join(c.opts.WorkDir, "credentials")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dir, file+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		return "", fmt.Errorf("write kubeconfig for ServiceAccount %s/%s: %w", namespace, name, err)
	}
	return path, nil
}

// standInPod is the pod a node-bound token is bound to: a pod of the
// ServiceAccount on node, as a DaemonSet would run there. It is reused when it
// exists, so that restarting a component keeps its identity.
func (c *Cluster) standInPod(ctx context.Context, namespace, serviceAccount, node string) (*corev1.Pod, error) {
	name := serviceAccount + "-" + node
	pods := c.Client.CoreV1().Pods(namespace)
	if pod, err := pods.Get(ctx, name, metav1.GetOptions{}); err == nil {
		return pod, nil
	} else if !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get stand-in pod %s/%s: %w", namespace, name, err)
	}
	standIn := corev1.Container{Name: "stand-in", Image: "registry.k8s.io/pause:3.10"}
	if c.opts.StandInImage != "" {
		standIn.Image, standIn.ImagePullPolicy = c.opts.StandInImage, corev1.PullNever
	}
	pod, err := pods.Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"prism.dev/testbed-stand-in": serviceAccount}},
		Spec: corev1.PodSpec{
			NodeName:                      node,
			ServiceAccountName:            serviceAccount,
			AutomountServiceAccountToken:  ptr.To(false),
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Tolerations:                   []corev1.Toleration{{Operator: corev1.TolerationOpExists}},
			Containers:                    []corev1.Container{standIn},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create stand-in pod %s/%s on node %s: %w", namespace, name, node, err)
	}
	return pod, nil
}
