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

// Package explaintest builds the fixtures of a MIG node for the tests of
// internal/explain and the prismctl commands that print it, from the plugin's
// own code and the simulator's NVML answers, so that what they read is
// what the plugin publishes. It also loads their testdata, runs the
// commands and compares what they print with golden files.
package explaintest

import (
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// MIGNode is the name of the node MIGSlices publishes.
const MIGNode = "node-m"

// The partitions MIGClaims holds: an A100-40GB's two 3g.20gb placements,
// at memory slices 0 and 4.
const (
	PartitionA = "gpu-0-mig-3g20gb-0"
	PartitionB = "gpu-0-mig-3g20gb-4"
)

// MIGSlices are the ResourceSlices of MIGNode as the plugin lays them out:
// gpu-0, an A100-SXM4-40GB in MIG mode with every partition, and gpu-1,
// an A100-SXM4-40GB not in MIG mode, published whole.
func MIGSlices(t testing.TB) []resourceapi.ResourceSlice {
	t.Helper()
	ctx := klog.NewContext(t.Context(), logr.Discard())
	fleet := &nvml.Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []nvml.GPUGroup{
		{Product: "NVIDIA A100-SXM4-40GB", Count: 1, MIGMode: true},
		{Product: "NVIDIA A100-SXM4-40GB", Count: 1},
	}}
	sim, err := nvml.NewSimulated(fleet, MIGNode)
	if err != nil {
		t.Fatal(err)
	}
	devices, err := nvml.Discover(ctx, sim, nvml.Options{})
	if err != nil {
		t.Fatal(err)
	}
	content, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]resourceapi.ResourceSlice, len(content))
	for i, c := range content {
		out[i] = resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", MIGNode, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         gpuv1alpha1.DriverName,
				Pool:           resourceapi.ResourcePool{Name: MIGNode, Generation: 1, ResourceSliceCount: int64(len(content))},
				NodeName:       ptr.To(MIGNode),
				Devices:        c.Devices,
				SharedCounters: c.SharedCounters,
			},
		}
	}
	return out
}

// MIGClaims are ml/job-a and ml/job-b, each allocated a 3g.20gb of
// MIGNode's gpu-0 (PartitionA and PartitionB) and reserved for a pod.
func MIGClaims() []resourceapi.ResourceClaim {
	claim := func(name, device string) resourceapi.ResourceClaim {
		return resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: gpuv1alpha1.DriverName,
					Selectors:       []resourceapi.DeviceSelector{ProfileSelector("3g.20gb")},
				},
			}}}},
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
					Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: gpuv1alpha1.DriverName, Pool: MIGNode, Device: device}},
				}},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: name + "-0", UID: types.UID("uid-" + name)}},
			},
		}
	}
	return []resourceapi.ResourceClaim{claim("job-a", PartitionA), claim("job-b", PartitionB)}
}

// ProfileSelector matches the partitions of one MIG profile.
func ProfileSelector(profile string) resourceapi.DeviceSelector {
	attr := fmt.Sprintf("device.attributes[%q].%s", gpuv1alpha1.DriverName, gpuv1alpha1.MIGProfileAttribute)
	return resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
		Expression: fmt.Sprintf("has(%s) && %s == %q", attr, attr, profile),
	}}
}
