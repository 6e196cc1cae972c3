//go:build gpu

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

package nvml

import (
	"io/fs"
	"math"
	"os"
	"sort"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/pkg/gpu"
)

// TestRealNVML runs discovery against the host's driver:
//
//	go test -tags gpu -run TestRealNVML -v ./pkg/gpu/nvml/
//
// PRISM_DRIVER_ROOT overrides the driver root (default "/").
func TestRealNVML(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := os.Getenv("PRISM_DRIVER_ROOT")
	if root == "" {
		root = "/"
	}
	lib, err := New(ctx, root)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	devices, err := Discover(ctx, lib, Options{})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(devices) == 0 {
		t.Fatalf("NVML loaded but reports no GPUs")
	}
	published, err := gpu.ResourceDevices(ctx, devices, gpu.PublishOptions{SysFS: os.DirFS("/sys").(fs.ReadLinkFS)})
	if err != nil {
		t.Fatalf("ResourceDevices: %v", err)
	}
	for i, d := range devices {
		t.Logf("%s: %s, %d bits at %d MHz memory, %d SMs at %d MHz",
			d.Name(), d.ProductName, d.MemoryBusWidthBits, d.MaxMemoryClockMHz, d.MultiprocessorCount, d.MaxSMClockMHz)
		rd := published[i]
		var names []string
		for name := range rd.Attributes {
			names = append(names, string(name))
		}
		sort.Strings(names)
		for _, name := range names {
			v := rd.Attributes[resourceapi.QualifiedName(name)]
			switch {
			case v.StringValue != nil:
				t.Logf("  %s = %q", name, *v.StringValue)
			case v.VersionValue != nil:
				t.Logf("  %s = version %s", name, *v.VersionValue)
			case v.IntValue != nil:
				t.Logf("  %s = %d", name, *v.IntValue)
			case v.BoolValue != nil:
				t.Logf("  %s = %t", name, *v.BoolValue)
			}
		}
		for name, c := range rd.Capacity {
			t.Logf("  capacity %s = %s", name, c.Value.String())
		}

		if d.ProductName == "NVIDIA H100 80GB HBM3" {
			bw := d.MemoryBandwidthGBps()
			if off := math.Abs(float64(bw)-3350) / 3350; off > 0.05 {
				t.Errorf("%s: H100 SXM bandwidth %d GB/s is %.1f%% off 3350", d.Name(), bw, 100*off)
			}
		}
	}
}
