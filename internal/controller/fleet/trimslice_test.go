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
	"github.com/google/go-cmp/cmp/cmpopts"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	gpudevice "github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// TestTrimSliceKeepsTheFleet: a view fed trimmed slices sees the same fleet
// as one fed the slices the plugin publishes, for every demo fleet and
// every way the plugin publishes, and the informer's store keys a trimmed
// slice as the slice.
func TestTrimSliceKeepsTheFleet(t *testing.T) {
	ctx := context.Background()
	fleets, err := filepath.Glob(filepath.Join("..", "..", "..", "demo", "fleets", "*.yaml"))
	if err != nil || len(fleets) == 0 {
		t.Fatalf("demo fleets: %v, %v", fleets, err)
	}
	for _, opts := range []gpudevice.PublishOptions{{}, {ShareMemory: true}, {FiguresAsCapacity: true}, {ShareMemory: true, FiguresAsCapacity: true}} {
		whole, trimmed := NewView(), NewView()
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
			if key, err := cache.MetaNamespaceKeyFunc(out); key != s.Name || err != nil {
				t.Errorf("%+v: a trimmed slice is stored as %q (%v), want %q", opts, key, err, s.Name)
			}
			trimmed.OnAdd(out, false)
		}
		if diff := cmp.Diff(whole.Fleet(), trimmed.Fleet()); diff != "" {
			t.Errorf("%+v: fleet from trimmed slices (-whole +trimmed):\n%s", opts, diff)
		}
		if diff := cmp.Diff(whole.NodeModels(), trimmed.NodeModels()); diff != "" {
			t.Errorf("%+v: node models from trimmed slices (-whole +trimmed):\n%s", opts, diff)
		}
	}
}

// TestTrimSliceInAnInformer: the informer stores Slices as it would the
// slices, under their names and in the namespace index controller-runtime
// adds, and the view follows it as slices come, change and go.
func TestTrimSliceInAnInformer(t *testing.T) {
	client := fake.NewClientset(gpus("node-a", 2), gpus("node-b", 4))
	api := client.ResourceV1().ResourceSlices()
	v := NewView()
	informer := runInformer(t, client, cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) { return api.List(ctx, opts) },
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return api.Watch(ctx, opts)
		},
	}, &resourceapi.ResourceSlice{}, TrimSlice, v)
	devices := func() int {
		n := 0
		for _, m := range v.Fleet().Models {
			n += m.Devices
		}
		return n
	}
	if got := devices(); got != 6 {
		t.Errorf("after the list: %d GPUs, want 6", got)
	}
	if diff := cmp.Diff([]string{"node-a", "node-b"}, informer.GetStore().ListKeys(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("store keys, want the slices' names (-want +got):\n%s", diff)
	}
	// The API server writes a new resourceVersion with each change, the
	// fake clientset the one it is given.
	grown := gpus("node-a", 3)
	grown.ResourceVersion = "2"
	if _, err := api.Update(t.Context(), grown, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-a's third GPU", func() bool { return devices() == 7 })
	if err := api.Delete(t.Context(), "node-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "node-b's GPUs gone", func() bool { return devices() == 3 })
}
