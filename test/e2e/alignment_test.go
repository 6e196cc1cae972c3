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
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/test/testbed"
)

// nicDriver stands for another vendor's DRA driver, one that publishes NICs
// with the standard PCIe-root attribute, as a NIC driver would.
const nicDriver = "nic.testbed.prism.dev"

// TestGPUAndNICAlignedByPCIeRoot: Prism publishes the standard
// resource.kubernetes.io/pcieRoot beside its own attributes, so that a claim
// for a GPU and a device of another driver, constrained with matchAttribute
// on that name, is allocated both under one PCIe root complex, and its pod
// runs with both drivers' devices prepared.
//
// The NIC driver publishes two NICs: one under a root that holds no GPU,
// listed first, and one under the root of the node's last GPU, which is not
// the root of its first. An allocator that ignored the constraint would take
// the first NIC or the first GPU.
func TestGPUAndNICAlignedByPCIeRoot(t *testing.T) {
	ctx, cluster, node := localNode(t)
	client := cluster.Client
	createPrismDeviceClass(ctx, t, cluster)
	startPlugin(ctx, t, cluster, node, fleetPath("h100-sxm-8.yaml"))
	gpuSlice := waitForSlice(ctx, t, client, node.Name, 8)

	rootOf := map[string]string{} // GPU device name -> its PCIe root
	for _, d := range gpuSlice.Spec.Devices {
		a, ok := d.Attributes[deviceattribute.StandardDeviceAttributePCIeRoot]
		if !ok || a.StringValue == nil {
			t.Fatalf("GPU %s publishes no %s: %+v", d.Name, deviceattribute.StandardDeviceAttributePCIeRoot, d.Attributes)
		}
		rootOf[d.Name] = *a.StringValue
	}
	first, last := gpuSlice.Spec.Devices[0].Name, gpuSlice.Spec.Devices[len(gpuSlice.Spec.Devices)-1].Name
	want := rootOf[last]
	if want == rootOf[first] {
		t.Fatalf("the fleet puts %s and %s under one root (%s); the test needs two", first, last, want)
	}

	if err := os.MkdirAll(node.PluginDir(nicDriver), 0o750); err != nil {
		t.Fatal(err)
	}
	nics := &smokePlugin{prepared: map[types.UID]bool{}}
	helper, err := kubeletplugin.Start(ctx, nics,
		kubeletplugin.DriverName(nicDriver),
		kubeletplugin.NodeName(node.Name),
		kubeletplugin.KubeClient(client),
		kubeletplugin.RegistrarDirectoryPath(node.RegistrarDir()),
		kubeletplugin.PluginDataDirectoryPath(node.PluginDir(nicDriver)),
		kubeletplugin.HealthService(false),
	)
	if err != nil {
		t.Fatalf("start the NIC driver: %v", err)
	}
	t.Cleanup(helper.Stop)
	waitRegistered(t, helper)
	nic := func(name, root string) resourceapi.Device {
		return resourceapi.Device{Name: name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			deviceattribute.StandardDeviceAttributePCIeRoot: {StringValue: ptr.To(root)},
		}}
	}
	mustCreate(t, func() error {
		_, err := client.ResourceV1().ResourceSlices().Create(ctx, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: node.Name + "-nics"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   nicDriver,
				NodeName: ptr.To(node.Name),
				Pool:     resourceapi.ResourcePool{Name: node.Name, ResourceSliceCount: 1},
				Devices:  []resourceapi.Device{nic("nic-elsewhere", "pci0000:fe"), nic("nic-aligned", want)},
			},
		}, metav1.CreateOptions{})
		return err
	})
	mustCreate(t, func() error {
		_, err := client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
			ObjectMeta: metav1.ObjectMeta{Name: nicDriver},
			Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
				CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + nicDriver + `"`},
			}}},
		}, metav1.CreateOptions{})
		return err
	})

	spec := gpuClaimSpec(1)
	spec.Devices.Requests = append(spec.Devices.Requests, resourceapi.DeviceRequest{Name: "nic", Exactly: &resourceapi.ExactDeviceRequest{
		DeviceClassName: nicDriver, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1,
	}})
	spec.Devices.Constraints = []resourceapi.DeviceConstraint{{
		Requests:       []string{"gpu", "nic"},
		MatchAttribute: ptr.To(resourceapi.FullyQualifiedName(deviceattribute.StandardDeviceAttributePCIeRoot)),
	}}
	createTemplate(ctx, t, client, "gpu-and-nic", spec)
	createPod(ctx, t, client, podWithClaim("aligned", "gpu-and-nic", ""))
	pod, err := testbed.WaitForPod(ctx, client, "default", "aligned", time.Minute, testbed.PodRunning)
	if err != nil {
		t.Fatal(err)
	}

	claim := podClaim(ctx, t, client, pod)
	got := map[string]string{} // driver -> device
	for _, r := range claim.Status.Allocation.Devices.Results {
		got[r.Driver] = r.Device
	}
	if got[nicDriver] != "nic-aligned" {
		t.Errorf("allocated NIC %q, want nic-aligned (the one under a GPU's root, %s); allocation %+v", got[nicDriver], want, claim.Status.Allocation.Devices.Results)
	}
	if gpu := got[gpuv1alpha1.DriverName]; rootOf[gpu] != want {
		t.Errorf("allocated GPU %q under root %q, want a GPU under the NIC's root %s (%v)", gpu, rootOf[gpu], want, gpusUnder(rootOf, want))
	}
	if !nics.wasPrepared(claim.UID) {
		t.Errorf("the kubelet never asked the NIC driver to prepare claim %s", claim.Name)
	}
	if pod.Status.Phase != corev1.PodRunning {
		t.Errorf("pod phase %s, want Running", pod.Status.Phase)
	}
}

// gpusUnder lists the GPUs under one root, for failure messages.
func gpusUnder(rootOf map[string]string, root string) []string {
	var out []string
	for gpu, r := range rootOf {
		if r == root {
			out = append(out, gpu)
		}
	}
	slices.Sort(out)
	return out
}
