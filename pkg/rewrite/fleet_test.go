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

package rewrite

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/deviceclasses"
)

// sku is one GPU model as testdata/gpus.json describes it.
type sku struct {
	ProductName           string `json:"productName"`
	Architecture          string `json:"architecture"`
	CUDAComputeCapability string `json:"cudaComputeCapability"`
	MemoryBandwidthGBps   int64  `json:"memoryBandwidthGBps"`
	BandwidthClass        string `json:"bandwidthClass"`
	MultiprocessorCount   int64  `json:"multiprocessorCount"`
	FP32GFLOPS            int64  `json:"fp32GFLOPS"`
	FP16TensorTFLOPS      *int64 `json:"fp16TensorTFLOPS"`
	MIGCapable            bool   `json:"migCapable"`
	Memory                string `json:"memory"`
}

func loadSKUs(tb testing.TB) map[string]sku {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "gpus.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var f struct {
		SKUs map[string]sku `json:"skus"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		tb.Fatal(err)
	}
	return f.SKUs
}

func attr(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func iattr(i int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &i} }
func battr(b bool) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{BoolValue: &b} }
func vattr(v string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: &v}
}

// nodeSlice publishes n GPUs of one model on one node, the way the kubelet
// plugin does: one pool per node, one slice.
func nodeSlice(node string, s sku, n int) *resourceapi.ResourceSlice {
	devices := make([]resourceapi.Device, n)
	for i := range devices {
		a := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			"uuid":                  attr(fmt.Sprintf("GPU-%s-%d", node, i)),
			"productName":           attr(s.ProductName),
			"architecture":          attr(s.Architecture),
			"cudaComputeCapability": vattr(s.CUDAComputeCapability),
			"memoryBandwidthGBps":   iattr(s.MemoryBandwidthGBps),
			"bandwidthClass":        attr(s.BandwidthClass),
			"multiprocessorCount":   iattr(s.MultiprocessorCount),
			"fp32GFLOPS":            iattr(s.FP32GFLOPS),
			"numaNode":              iattr(int64(i / 4)),
			"nvlinkDomain":          iattr(0),
			"migCapable":            battr(s.MIGCapable),
			"index":                 iattr(int64(i)),
		}
		if s.FP16TensorTFLOPS != nil {
			a["fp16TensorTFLOPS"] = iattr(*s.FP16TensorTFLOPS)
		}
		devices[i] = resourceapi.Device{
			Name:       fmt.Sprintf("gpu-%d", i),
			Attributes: a,
			Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
				"memory": {Value: resource.MustParse(s.Memory)},
			},
		}
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + gpuv1alpha1.DriverName},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   gpuv1alpha1.DriverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
}

func gpuClasses() deviceclasses.Static {
	return deviceclasses.Static{
		DeviceClassName: {
			ObjectMeta: metav1.ObjectMeta{Name: DeviceClassName},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "gpu.prism.dev"`}}},
			},
		},
		TierDeviceClassName: {ObjectMeta: metav1.ObjectMeta{Name: TierDeviceClassName}},
	}
}

// Feature sets of the two allocator implementations kube-scheduler picks
// from. 1.37 defaults select "incubating" (consumable capacity and binding
// conditions are beta and on).
var (
	stableFeatures = structured.Features{
		AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
	}
	incubatingFeatures = structured.Features{
		AdminAccess: true, PrioritizedList: true, PartitionableDevices: true, DeviceTaints: true,
		DeviceBindingAndStatus: true, ConsumableCapacity: true,
	}
)

// fleet is a set of nodes with their slices.
type fleet struct {
	nodes  []*v1.Node
	model  []string // GPU model per node, same index as nodes
	slices []*resourceapi.ResourceSlice
}

func newFleet(tb testing.TB, layout ...any) *fleet {
	tb.Helper()
	skus := loadSKUs(tb)
	f := &fleet{}
	for i := 0; i < len(layout); i += 3 {
		model, nodes, gpus := layout[i].(string), layout[i+1].(int), layout[i+2].(int)
		s, ok := skus[model]
		if !ok {
			tb.Fatalf("unknown SKU %q", model)
		}
		for n := 0; n < nodes; n++ {
			name := fmt.Sprintf("%s-%d", sanitize(model), n)
			f.nodes = append(f.nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			f.model = append(f.model, model)
			f.slices = append(f.slices, nodeSlice(name, s, gpus))
		}
	}
	return f
}

func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			if c >= 'A' && c <= 'Z' {
				out[i] = c - 'A' + 'a'
			} else {
				out[i] = '-'
			}
		}
	}
	return string(out)
}

func (f *fleet) allocator(tb testing.TB, features structured.Features, allocated sets.Set[structured.DeviceID]) (structured.Allocator, *cel.Cache) {
	tb.Helper()
	cache := cel.NewCache(10, cel.Features{EnableConsumableCapacity: features.ConsumableCapacity})
	if allocated == nil {
		allocated = sets.New[structured.DeviceID]()
	}
	state := structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}
	a, err := structured.NewAllocator(context.Background(), features, state, gpuClasses(), f.slices, cache)
	if err != nil {
		tb.Fatal(err)
	}
	return a, cache
}

func claimFor(spec *resourceapi.ResourceClaimSpec) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "claim", Namespace: "default", UID: "uid-1"},
		Spec:       *spec,
	}
}

func readFixture(tb testing.TB, name string) []byte {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		tb.Fatal(err)
	}
	return data
}
