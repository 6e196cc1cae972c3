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
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/test/testbed"
)

// TestExtendedResourceGetsAPrismGPU: with the chart's DeviceClasses
// rendered with deviceClasses.extendedResourceName=nvidia.com/gpu, an
// unchanged pod that asks for nvidia.com/gpu: 1 runs on a Prism GPU:
// kube-scheduler makes and allocates its claim, the plugin prepares it, and
// deleting the pod unprepares it.
func TestExtendedResourceGetsAPrismGPU(t *testing.T) {
	ctx, cluster, node := localNode(t)
	file := templateToFile(ctx, t, cluster, "deviceclasses.yaml", "--kube-version", "1.37.1", "--set", "deviceClasses.extendedResourceName=nvidia.com/gpu",
		"--show-only", "templates/deviceclasses.yaml")
	if out, err := testbed.Kubectl(ctx, cluster, "apply", "-f", file); err != nil {
		t.Fatalf("kubectl apply: %v\n%s", err, out)
	}
	p := startPlugin(ctx, t, cluster, node, fleetPath("t4-2.yaml"))
	waitForSlice(ctx, t, cluster.Client, node.Name, 2)

	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "unchanged", Namespace: "default"},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](0),
			Containers: []corev1.Container{{
				Name: "cuda", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}},
			}},
		},
	}
	createPod(ctx, t, cluster.Client, pod)
	var claimName string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := cluster.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if s := got.Status.ExtendedResourceClaimStatus; s != nil {
			claimName = s.ResourceClaimName
		}
		return got.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		got, _ := cluster.Client.CoreV1().Pods("default").Get(ctx, pod.Name, metav1.GetOptions{})
		t.Fatalf("the pod asking for nvidia.com/gpu did not run: %v\nstatus: %+v", err, got.Status)
	}
	if claimName == "" {
		t.Fatal("the running pod names no extended-resource claim in its status")
	}
	claim, err := cluster.Client.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a := claim.Status.Allocation; a == nil || len(a.Devices.Results) != 1 || a.Devices.Results[0].Driver != "gpu.prism.dev" || a.Devices.Results[0].Pool != node.Name {
		t.Fatalf("claim %s allocation %+v, want one device of gpu.prism.dev on %s", claimName, claim.Status.Allocation, node.Name)
	}
	spec := filepath.Join(p.CDIRoot, cdi.SpecFileName(string(claim.UID)))
	if _, err := os.Stat(spec); err != nil {
		t.Fatalf("the plugin wrote no CDI spec for the claim: %v", err)
	}

	deletePod(ctx, t, cluster, pod.Name)
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		_, err := os.Stat(spec)
		return os.IsNotExist(err), nil
	})
	if err != nil {
		t.Errorf("the claim's CDI spec outlived the pod: %v", err)
	}
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := cluster.Client.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
	if err != nil {
		t.Errorf("the scheduler's claim outlived the pod: %v", err)
	}
}
