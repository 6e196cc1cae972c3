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

package fleet

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	gpudevice "github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// TestTrimSliceKeepsTheFleet: a view fed trimmed slices sees the same fleet
// as one fed the slices the plugin publishes, for every demo fleet and
// every way the plugin publishes.
func TestTrimSliceKeepsTheFleet(t *testing.T) {
	ctx := context.Background()
	fleets, err := filepath.Glob(filepath.Join("..", "..", "demo", "fleets", "*.yaml"))
	if err != nil || len(fleets) == 0 {
		t.Fatalf("demo fleets: %v, %v", fleets, err)
	}
	for _, opts := range []gpudevice.PublishOptions{{}, {ShareMemory: true}, {FiguresAsCapacity: true}, {ShareMemory: true, FiguresAsCapacity: true}} {
		whole, trimmed := NewView(), NewView()
		attributes := 0
		for i, path := range fleets {
			node := fmt.Sprintf("node-%d", i)
			devices, _, err := nvml.NewFleetInventory(path, node).Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			published, err := gpudevice.ResourceDevices(ctx, devices, opts)
			if err != nil {
				t.Fatal(err)
			}
			s := &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: node + "-gpu.prism.dev", UID: types.UID(node), ResourceVersion: "7"},
				Spec: resourceapi.ResourceSliceSpec{Driver: gpuv1alpha1.DriverName, NodeName: ptr.To(node),
					Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}, Devices: published},
			}
			whole.OnAdd(s, false)
			out, err := TrimSlice(s)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range out.(*resourceapi.ResourceSlice).Spec.Devices {
				attributes = max(attributes, len(d.Attributes))
			}
			trimmed.OnAdd(out, false)
		}
		if diff := cmp.Diff(whole.Fleet(), trimmed.Fleet()); diff != "" {
			t.Errorf("%+v: fleet from trimmed slices (-whole +trimmed):\n%s", opts, diff)
		}
		if diff := cmp.Diff(whole.NodeModels(), trimmed.NodeModels()); diff != "" {
			t.Errorf("%+v: node models from trimmed slices (-whole +trimmed):\n%s", opts, diff)
		}
		if attributes > len(summarisedAttributes) {
			t.Errorf("%+v: a trimmed device keeps %d attributes, more than the %d the view reads", opts, attributes, len(summarisedAttributes))
		}
	}
}
