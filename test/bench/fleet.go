// Package bench measures Prism end to end on the local test bed: the
// structured allocator in process, kube-scheduler throughput, the kubelet
// plugin's NodePrepareResources over its real gRPC socket, the admission
// webhook over TLS, and the processes' footprint. Every result is a Row that
// compares two things measured in the same run; cmd/prism-bench prints them
// as one table and writes them as JSON.
package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// SKU is one GPU model as pkg/rewrite/testdata/gpus.json describes it (the
// same data pkg/rewrite's BenchmarkAllocator uses).
type SKU struct {
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

// LoadSKUs reads the SKU table from the repository.
func LoadSKUs(repoRoot string) (map[string]SKU, error) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "pkg", "rewrite", "testdata", "gpus.json"))
	if err != nil {
		return nil, err
	}
	var f struct {
		SKUs map[string]SKU `json:"skus"`
	}
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	return f.SKUs, nil
}

// MixedModels is the fleet mix: equal parts of each.
var MixedModels = []string{"H100", "A100-80", "L40S", "L4"}

// Fleet is a set of nodes with one ResourceSlice each.
type Fleet struct {
	Nodes  []*v1.Node
	Model  []string
	Slices []*resourceapi.ResourceSlice
}

// NewMixedFleet builds n nodes (n/4 of each MixedModels entry) with gpus
// GPUs each, named <prefix><model>-<i>.
func NewMixedFleet(skus map[string]SKU, prefix string, n, gpus int) (*Fleet, error) {
	f := &Fleet{}
	per := n / len(MixedModels)
	for _, model := range MixedModels {
		s, ok := skus[model]
		if !ok {
			return nil, fmt.Errorf("unknown SKU %q", model)
		}
		for i := 0; i < per; i++ {
			name := fmt.Sprintf("%s%s-%d", prefix, sanitize(model), i)
			f.Nodes = append(f.Nodes, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}})
			f.Model = append(f.Model, model)
			f.Slices = append(f.Slices, NodeSlice(name, s, gpus))
		}
	}
	return f, nil
}

func sanitize(s string) string {
	out := []byte(s)
	for i, c := range out {
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c >= 'A' && c <= 'Z':
			out[i] = c - 'A' + 'a'
		default:
			out[i] = '-'
		}
	}
	return string(out)
}

func attr(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func iattr(i int64) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{IntValue: &i} }
func battr(b bool) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{BoolValue: &b} }
func vattr(v string) resourceapi.DeviceAttribute {
	return resourceapi.DeviceAttribute{VersionValue: &v}
}

// NodeSlice publishes n GPUs of one model on one node the way the kubelet
// plugin does: one pool per node, one slice (copied from pkg/rewrite's
// fleet_test.go so that the numbers are comparable).
func NodeSlice(node string, s SKU, n int) *resourceapi.ResourceSlice {
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
		ObjectMeta: metav1.ObjectMeta{Name: node + "-" + rewrite.DriverName},
		Spec: resourceapi.ResourceSliceSpec{
			Driver:   rewrite.DriverName,
			NodeName: ptr.To(node),
			Pool:     resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			Devices:  devices,
		},
	}
}

func qty(s string) *resource.Quantity {
	q := resource.MustParse(s)
	return &q
}

// Profiles are the workload profiles of pkg/rewrite's BenchmarkAllocator:
// each ladder once; the 20Gi variants need 39Gi, so L4 nodes reject them.
var Profiles = []struct {
	Name    string
	Profile rewrite.Profile
}{
	{"MemoryBound-performance", rewrite.Profile{BoundType: rewrite.MemoryBound, Policy: rewrite.Performance, PeakMemory: qty("16Gi")}},
	{"MemoryBound-performance-20Gi", rewrite.Profile{BoundType: rewrite.MemoryBound, Policy: rewrite.Performance, PeakMemory: qty("20Gi")}},
	{"MemoryBound-economy", rewrite.Profile{BoundType: rewrite.MemoryBound, Policy: rewrite.Economy, PeakMemory: qty("16Gi")}},
	{"ComputeBound-performance", rewrite.Profile{BoundType: rewrite.ComputeBound, Policy: rewrite.Performance, PeakMemory: qty("16Gi")}},
	{"ComputeBound-economy-20Gi-cc8.0", rewrite.Profile{BoundType: rewrite.ComputeBound, Policy: rewrite.Economy, PeakMemory: qty("20Gi"), MinComputeCapability: "8.0"}},
	{"LatencyBound-performance", rewrite.Profile{BoundType: rewrite.LatencyBound, Policy: rewrite.Performance, PeakMemory: qty("8Gi")}},
	{"LatencyBound-economy", rewrite.Profile{BoundType: rewrite.LatencyBound, Policy: rewrite.Economy, PeakMemory: qty("8Gi")}},
}

// GPUSpec is a claim spec for count GPUs of class gpu.prism.dev, request "gpu".
func GPUSpec(count int64) *resourceapi.ResourceClaimSpec {
	return &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu",
		Exactly: &resourceapi.ExactDeviceRequest{
			DeviceClassName: rewrite.DeviceClassName,
			AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
			Count:           count,
		},
	}}}}
}

// RewrittenSpec is GPUSpec(count) after Rewrite with the profile, what the
// mutating webhook stores.
func RewrittenSpec(ctx context.Context, count int64, p rewrite.Profile) (*resourceapi.ResourceClaimSpec, error) {
	spec, _, err := rewrite.Rewrite(ctx, GPUSpec(count), p)
	return spec, err
}
