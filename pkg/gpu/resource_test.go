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

package gpu

import (
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/blang/semver/v4"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/goldentest"
)

// h100 is a fully populated device, as discovery would produce it: its
// memory is what NVML reports on a real one.
func h100() Device {
	return Device{
		UUID:                  "GPU-8f6b1c52-3a6e-4bd4-9d22-0c2f1b7e5a10",
		Index:                 2,
		Minor:                 2,
		ProductName:           "NVIDIA H100 80GB HBM3",
		Brand:                 "NVIDIA",
		Architecture:          "Hopper",
		CUDAComputeCapability: ComputeCapability{9, 0},
		DriverVersion:         "535.104.05",
		CUDADriverVersion:     "12.2",
		MemoryBytes:           81559 << 20,
		MemoryBusWidthBits:    5120,
		MaxMemoryClockMHz:     2619,
		MaxSMClockMHz:         1980,
		MultiprocessorCount:   132,
		PCIBusID:              "0000:27:00.0",
		NUMANode:              ptr.To(0),
		PCIeGeneration:        5,
		PCIeLinkWidth:         16,
		NVLinkDomain:          ptr.To(0),
		MIGCapable:            true,
	}
}

// fakeSysFS places 0000:27:00.0 under root complex pci0000:20.
func fakeSysFS() fstest.MapFS {
	return fstest.MapFS{
		"bus/pci/devices/0000:27:00.0": {Mode: fs.ModeSymlink, Data: []byte("../../../devices/pci0000:20/0000:20:01.0/0000:27:00.0")},
	}
}

func TestResourceDeviceGolden(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	got, err := h100().ResourceDevice(ctx, PublishOptions{SysFS: fakeSysFS()})
	if err != nil {
		t.Fatalf("ResourceDevice: %v", err)
	}
	goldentest.Compare(t, filepath.Join("testdata", "h100.golden.json"), goldentest.JSON(t, got))
}

func TestResourceDeviceOmitsWhatIsUnknown(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := h100()
	d.ProductName = "NVIDIA Imaginary 9000" // not in the spec table
	d.NUMANode = nil
	d.NVLinkDomain = nil
	d.PCIeGeneration = 0
	d.CUDAComputeCapability = ComputeCapability{99, 0}
	got, err := d.ResourceDevice(ctx, PublishOptions{})
	if err != nil {
		t.Fatalf("ResourceDevice: %v", err)
	}
	for _, id := range []string{"fp16TensorTFLOPS", "numaNode", "nvlinkDomain", "pcieGeneration", "fp32GFLOPS"} {
		if v, ok := got.Attributes[qualified(id)]; ok {
			t.Errorf("attribute %s = %+v, want it omitted", id, v)
		}
	}
	if v, ok := got.Attributes["resource.kubernetes.io/pcieRoot"]; ok {
		t.Errorf("pcieRoot = %q without a sysfs tree, want it omitted", *v.StringValue)
	}
	if _, ok := got.Attributes["resource.kubernetes.io/pciBusID"]; !ok {
		t.Errorf("pciBusID needs no sysfs and must still be published")
	}
}

func TestResourceDeviceEnforcesValueLimits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := h100()
	d.ProductName = "NVIDIA " + strings.Repeat("Very Long Product Name ", 5)
	d.DriverVersion = "550.54.15-beta"
	d.PCIBusID = "00000000:27:00.0" // NVML's spelling, not the API's
	got, err := d.ResourceDevice(ctx, PublishOptions{SysFS: fakeSysFS()})
	if err != nil {
		t.Fatalf("ResourceDevice: %v", err)
	}
	name := *got.Attributes[qualified("productName")].StringValue
	if len(name) != resourceapi.DeviceAttributeMaxValueLength || !strings.HasPrefix(d.ProductName, name) {
		t.Errorf("productName = %q (%d chars), want the first %d characters", name, len(name), resourceapi.DeviceAttributeMaxValueLength)
	}
	for _, dropped := range []resourceapi.QualifiedName{qualified("driverVersion"), "resource.kubernetes.io/pciBusID", "resource.kubernetes.io/pcieRoot"} {
		if v, ok := got.Attributes[dropped]; ok {
			t.Errorf("%s = %+v, want it dropped as invalid", dropped, v)
		}
	}
	if _, ok := got.Attributes[qualified("uuid")]; !ok {
		t.Errorf("one bad value must not cost the device its other attributes")
	}
}

func TestResourceDeviceRequiresUUID(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	d := h100()
	d.UUID = ""
	if _, err := d.ResourceDevice(ctx, PublishOptions{}); err == nil || !strings.Contains(err.Error(), "gpu-2") {
		t.Errorf("ResourceDevice without UUID: err = %v, want an error naming gpu-2", err)
	}
}

// Every product the driver knows must fit the API's limits with every
// optional attribute present, and every version must be strict semver as
// the API server validates it.
func TestEveryProductFitsAPILimits(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, s := range specs {
		t.Run(s.Product, func(t *testing.T) {
			d := h100()
			d.ProductName, d.Brand, d.Architecture = s.Product, s.Brand, s.Architecture
			d.CUDAComputeCapability = s.ComputeCapability
			got, err := d.ResourceDevice(ctx, PublishOptions{SysFS: fakeSysFS()})
			if err != nil {
				t.Fatalf("ResourceDevice: %v", err)
			}
			if n := len(got.Attributes) + len(got.Capacity); n > resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice {
				t.Errorf("%d attributes and capacities, API allows %d", n, resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
			}
			want := 21
			if s.FP16TensorTFLOPS == 0 {
				want-- // no tensor cores (Pascal): no fp16TensorTFLOPS
			}
			if len(got.Attributes) != want {
				t.Errorf("published %d attributes, want %d", len(got.Attributes), want)
			}
			for name, v := range got.Attributes {
				if id := name[strings.LastIndex(string(name), "/")+1:]; len(id) > resourceapi.DeviceMaxIDLength {
					t.Errorf("attribute ID %q is longer than %d", id, resourceapi.DeviceMaxIDLength)
				}
				for _, s := range []*string{v.StringValue, v.VersionValue} {
					if s != nil && len(*s) > resourceapi.DeviceAttributeMaxValueLength {
						t.Errorf("%s = %q is longer than %d", name, *s, resourceapi.DeviceAttributeMaxValueLength)
					}
				}
				if v.VersionValue != nil {
					if _, err := semver.Parse(*v.VersionValue); err != nil {
						t.Errorf("%s = %q is not semver: %v", name, *v.VersionValue, err)
					}
				}
			}
		})
	}
}

func TestEnforceLimitsDropsFromTheEnd(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	var attrs []namedAttribute
	for i := range 40 {
		attrs = append(attrs, namedAttribute{qualified(fmt.Sprintf("a%02d", i)), resourceapi.DeviceAttribute{IntValue: ptr.To(int64(i))}})
	}
	got := enforceLimits(logger, attrs, 1)
	if len(got) != 31 {
		t.Fatalf("kept %d attributes next to 1 capacity, want 31", len(got))
	}
	if _, ok := got[qualified("a30")]; !ok {
		t.Errorf("a30 was dropped; the first attributes have priority")
	}
	if _, ok := got[qualified("a31")]; ok {
		t.Errorf("a31 was kept; it is past the budget")
	}
}

func TestSemverFromDotted(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		wantErr  bool
	}{
		{in: "550.54.15", want: "550.54.15"},
		{in: "535.104.05", want: "535.104.5"},
		{in: "12.4", want: "12.4.0"},
		{in: "9.0", want: "9.0.0"},
		{in: "560", want: "560.0.0"},
		{in: "32.0.15.6094", want: "32.0.15+6094"},
		{in: "550.54.15-beta", wantErr: true},
		{in: "550..15", wantErr: true},
		{in: "1.2.3.", wantErr: true},
		{in: "v550", wantErr: true},
	} {
		got, err := semverFromDotted(tc.in)
		if tc.wantErr {
			if err == nil {
				t.Errorf("semverFromDotted(%q) = %q, want an error", tc.in, got)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("semverFromDotted(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
		if _, err := semver.Parse(got); err != nil {
			t.Errorf("semverFromDotted(%q) = %q, which is not semver: %v", tc.in, got, err)
		}
	}
}

func TestResourceDevicesAreSortedAndUnique(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	var devices []Device
	for _, i := range []int{7, 0, 11, 2} {
		d := h100()
		d.Index, d.UUID = i, fmt.Sprintf("GPU-%d", i)
		devices = append(devices, d)
	}
	got, err := ResourceDevices(ctx, devices, PublishOptions{})
	if err != nil {
		t.Fatalf("ResourceDevices: %v", err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.Name)
	}
	if want := []string{"gpu-0", "gpu-2", "gpu-7", "gpu-11"}; !slices.Equal(names, want) {
		t.Errorf("names = %q, want %q", names, want)
	}
	if devices[0].Index != 7 {
		t.Errorf("ResourceDevices reordered its input")
	}

	devices[1].Index = 7
	if _, err := ResourceDevices(ctx, devices, PublishOptions{}); err == nil {
		t.Errorf("two devices with index 7 were accepted; they would share a name")
	}
}

// TestResourceDeviceFiguresAsCapacity: the figures a tier ranks by are
// published as capacities only when asked, and never on a shareable GPU,
// where a capacity request would consume them instead of comparing.
func TestResourceDeviceFiguresAsCapacity(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	figures := []resourceapi.QualifiedName{qualified("memoryBandwidthGBps"), qualified("fp32GFLOPS")}
	for _, tc := range []struct {
		name string
		opts PublishOptions
		want bool
	}{
		{"off by default", PublishOptions{}, false},
		{"asked for", PublishOptions{FiguresAsCapacity: true}, true},
		{"shareable GPU", PublishOptions{FiguresAsCapacity: true, ShareMemory: true}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := h100().ResourceDevice(ctx, tc.opts)
			if err != nil {
				t.Fatalf("ResourceDevice: %v", err)
			}
			for _, name := range figures {
				c, published := got.Capacity[name]
				attr := got.Attributes[name].IntValue
				switch {
				case published != tc.want:
					t.Errorf("capacity %s published = %v, want %v", name, published, tc.want)
				case published && (attr == nil || c.Value.Value() != *attr):
					t.Errorf("capacity %s = %s, want the attribute's value %v", name, c.Value.String(), ptr.Deref(attr, -1))
				}
				if published && c.RequestPolicy != nil {
					t.Errorf("capacity %s has a request policy; a figure is compared, never shared", name)
				}
			}
			if _, ok := got.Capacity[qualified("memory")]; !ok {
				t.Errorf("memory capacity missing")
			}
			sm, published := got.Capacity[qualified("smVersion")]
			if published != tc.want || published && sm.Value.Value() != 90 {
				t.Errorf("smVersion published = %v (%s), want %v and 90 for the H100's 9.0", published, sm.Value.String(), tc.want)
			}
		})
	}
}

// TestSMVersionOrdersAsTheComputeCapability: a capacity floor on smVersion
// admits exactly the GPUs a semver floor on the compute capability does,
// and a capability whose number would not order that way is not published.
func TestSMVersionOrdersAsTheComputeCapability(t *testing.T) {
	for _, tc := range []struct {
		cc   ComputeCapability
		want int64 // 0: not published
	}{
		{ComputeCapability{7, 5}, 75},
		{ComputeCapability{8, 0}, 80},
		{ComputeCapability{8, 9}, 89},
		{ComputeCapability{9, 0}, 90},
		{ComputeCapability{10, 0}, 100},
		{ComputeCapability{12, 1}, 121},
		{ComputeCapability{8, 10}, 0}, // would read as 90, above 8.9 and equal to 9.0
		{ComputeCapability{0, 0}, 0},  // unknown
	} {
		got, ok := tc.cc.SMVersion()
		if ok != (tc.want != 0) || got != tc.want {
			t.Errorf("%s: smVersion %d, %v; want %d", tc.cc, got, ok, tc.want)
		}
	}
}

// qualified is a name in the driver's domain, spelled out as a test reads
// it.
func qualified(id string) resourceapi.QualifiedName {
	return resourceapi.QualifiedName(gpuv1alpha1.DriverName + "/" + id)
}

// TestResourceDeviceShareable: a shareable GPU offers its memory in whole
// GiB and its compute in steps of 5 per cent. A claim that names neither
// takes all the memory, rounded down to a whole GiB (79Gi of 81559Mi), so
// that it still gets a whole GPU, and no compute,
// so that a claim naming only memory shares the GPU's time as before.
func TestResourceDeviceShareable(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	q := func(s string) *resource.Quantity { return ptr.To(resource.MustParse(s)) }
	for _, tc := range []struct {
		name string
		opts PublishOptions
		want map[resourceapi.QualifiedName]resourceapi.DeviceCapacity
	}{
		{"whole GPUs", PublishOptions{}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			qualified("memory"): {Value: resource.MustParse("81559Mi")},
		}},
		{"shareable", PublishOptions{ShareMemory: true}, map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			qualified("memory"): {Value: resource.MustParse("81559Mi"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: q("79Gi"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("1Gi"), Step: q("1Gi")}}},
			qualified("compute"): {Value: resource.MustParse("100"), RequestPolicy: &resourceapi.CapacityRequestPolicy{
				Default: q("0"), ValidRange: &resourceapi.CapacityRequestPolicyRange{Min: q("0"), Max: q("100"), Step: q("5")}}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := h100().ResourceDevice(ctx, tc.opts)
			if err != nil {
				t.Fatalf("ResourceDevice: %v", err)
			}
			if diff := cmp.Diff(tc.want, got.Capacity); diff != "" {
				t.Errorf("capacities (-want +got):\n%s", diff)
			}
			if shareable := ptr.Deref(got.AllowMultipleAllocations, false); shareable != tc.opts.ShareMemory {
				t.Errorf("allowMultipleAllocations = %v, want %v", shareable, tc.opts.ShareMemory)
			}
		})
	}
}
