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
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/test/testbed"
)

const smokeDriver = "smoke.testbed.prism.dev"

// smokePlugin is the smallest DRA driver the kubelet accepts: it prepares any
// claim without CDI devices and remembers which claims it saw.
type smokePlugin struct {
	mu       sync.Mutex
	prepared map[types.UID]bool
}

func (p *smokePlugin) PrepareResourceClaims(ctx context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		p.prepared[c.UID] = true
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
		}
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

func (p *smokePlugin) UnprepareResourceClaims(ctx context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		delete(p.prepared, c.UID)
		out[c.UID] = nil
	}
	return out, nil
}

func (p *smokePlugin) HandleError(ctx context.Context, err error, msg string) {}

func (p *smokePlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *smokePlugin) wasPrepared(uid types.UID) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.prepared[uid]
}

// TestSmokeDRAPodRunsOnRealKubelet is the test bed's own acceptance test: a
// real kubelet registers a Ready node, and a pod whose claim template selects a
// device by CEL is allocated that device by the real scheduler, its claim made
// by the real controller-manager, and it runs through the fake CRI.
func TestSmokeDRAPodRunsOnRealKubelet(t *testing.T) {
	ctx, cluster, node := localNode(t)
	if err := os.MkdirAll(node.PluginDir(smokeDriver), 0o750); err != nil {
		t.Fatal(err)
	}
	plugin := &smokePlugin{prepared: map[types.UID]bool{}}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.DriverName(smokeDriver),
		kubeletplugin.NodeName(node.Name),
		kubeletplugin.KubeClient(cluster.Client),
		kubeletplugin.RegistrarDirectoryPath(node.RegistrarDir()),
		kubeletplugin.PluginDataDirectoryPath(node.PluginDir(smokeDriver)),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		t.Fatalf("start smoke DRA driver: %v", err)
	}
	t.Cleanup(helper.Stop)
	waitRegistered(t, helper)

	client := cluster.Client
	mustCreate(t, func() error {
		_, err := client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: smokeDriver},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + smokeDriver + `"`},
			}}},
		}, metav1.CreateOptions{})
		return err
	})
	attr := func(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: ptr.To(s)} }
	mustCreate(t, func() error {
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: "localhost-smoke"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   smokeDriver,
				NodeName: ptr.To(node.Name),
				Pool:     resourceapi.ResourcePool{Name: node.Name, ResourceSliceCount: 1},
				Devices: []resourceapi.Device{
					{Name: "small", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"model": attr("small")}},
					{Name: "big", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"model": attr("big")}},
				},
			},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := client.ResourceV1().ResourceClaimTemplates("default").Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "big-device"},
			Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
				Requests: []resourceapi.DeviceRequest{{Name: "dev", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: smokeDriver,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
						Expression: `device.attributes["` + smokeDriver + `"].model == "big"`,
					}}},
				}}},
			}}},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := client.CoreV1().Pods("default").Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "smoke"},
			Spec: corev1.PodSpec{
				ResourceClaims: []corev1.PodResourceClaim{{Name: "dev", ResourceClaimTemplateName: ptr.To("big-device")}},
				Containers: []corev1.Container{{
					Name: "app", Image: "registry.k8s.io/pause:3.10",
					Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "dev"}}},
				}},
			},
		}, metav1.CreateOptions{})
		return err
	})

	pod, err := testbed.WaitForPod(ctx, client, "default", "smoke", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.NodeName != node.Name {
		t.Errorf("pod bound to %q, want %q", pod.Spec.NodeName, node.Name)
	}
	if len(pod.Status.ResourceClaimStatuses) != 1 || pod.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
		t.Fatalf("controller-manager did not record a generated claim: %+v", pod.Status.ResourceClaimStatuses)
	}
	claimName := *pod.Status.ResourceClaimStatuses[0].ResourceClaimName
	claim, err := client.ResourceV1().ResourceClaims("default").Get(ctx, claimName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if claim.Status.Allocation == nil || len(claim.Status.Allocation.Devices.Results) != 1 {
		t.Fatalf("claim %s not allocated one device: %+v", claimName, claim.Status.Allocation)
	}
	if got := claim.Status.Allocation.Devices.Results[0].Device; got != "big" {
		t.Errorf("scheduler allocated device %q, want the one the CEL selector matches (big)", got)
	}
	if len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].Name != "smoke" {
		t.Errorf("claim reserved for %+v, want pod smoke", claim.Status.ReservedFor)
	}
	if !plugin.wasPrepared(claim.UID) {
		t.Errorf("kubelet never asked the driver to prepare claim %s", claimName)
	}
	if created := node.Runtime.Created("default", "smoke"); len(created) != 1 || created[0].Name != "app" {
		t.Errorf("fake CRI created %+v, want one container app", created)
	}
}

func mustCreate(t *testing.T, create func() error) {
	t.Helper()
	if err := create(); err != nil {
		t.Fatal(err)
	}
}

// waitRegistered waits until the kubelet has registered the in-process
// driver. A pod that reaches the kubelet before that fails its sync and is
// retried only after 10-15 s.
func waitRegistered(t *testing.T, helper *kubeletplugin.Helper) {
	t.Helper()
	waitFor(t, "the kubelet registered the driver", func() bool {
		s := helper.RegistrationStatus()
		return s != nil && s.PluginRegistered
	})
}
