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
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/goldentest"
	"github.com/prismgpu/prism/pkg/gpu"
)

func simulate(t *testing.T, f *Fleet, node string) *Simulated {
	t.Helper()
	s, err := NewSimulated(f, node)
	if err != nil {
		t.Fatalf("NewSimulated: %v", err)
	}
	return s
}

func oneOf(product string) *Fleet {
	return &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []GPUGroup{{Product: product, Count: 1}}}
}

func discover(t *testing.T, lib nvml.Interface) []gpu.Device {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	devices, err := Discover(ctx, lib, Options{})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return devices
}

func loadFleet(t *testing.T, path string) *Fleet {
	t.Helper()
	f, err := LoadFleet(path)
	if err != nil {
		t.Fatalf("LoadFleet: %v", err)
	}
	return f
}

// Bandwidth is computed from the clock and bus width each simulated GPU
// reports through NVML, and must land on the datasheet figure.
func TestBandwidthFromNVMLMatchesDatasheet(t *testing.T) {
	for _, tc := range []struct {
		product   string
		datasheet int
		class     string
	}{
		{"Tesla T4", 320, "low"},
		{"NVIDIA L4", 300, "low"},
		{"NVIDIA A10", 600, "mid"},
		{"NVIDIA A100-SXM4-80GB", 2039, "high"},
		{"NVIDIA H100 80GB HBM3", 3350, "ultra"},
		{"NVIDIA H200", 4800, "ultra"},
	} {
		t.Run(tc.product, func(t *testing.T) {
			sim := simulate(t, oneOf(tc.product), "node-a")
			d := discover(t, sim)[0]
			if len(sim.Devices()[0].GetMaxClockInfoCalls()) == 0 || len(sim.Devices()[0].GetMemoryBusWidthCalls()) == 0 {
				t.Fatalf("discovery did not ask NVML for clocks and bus width")
			}
			got := d.MemoryBandwidthGBps()
			if off := math.Abs(float64(got-tc.datasheet)) / float64(tc.datasheet); off > 0.02 {
				t.Errorf("bandwidth = %d GB/s (%d bits at %d MHz), %.1f%% off the datasheet's %d",
					got, d.MemoryBusWidthBits, d.MaxMemoryClockMHz, 100*off, tc.datasheet)
			}
			if d.BandwidthClass() != tc.class {
				t.Errorf("class = %q, want %q", d.BandwidthClass(), tc.class)
			}
		})
	}
}

func TestFP32FromNVMLMatchesDatasheet(t *testing.T) {
	for _, product := range gpu.Products() {
		spec, _ := gpu.LookupSpec(product)
		if spec.FP32TFLOPS == 0 {
			continue
		}
		t.Run(product, func(t *testing.T) {
			sim := simulate(t, oneOf(product), "node-a")
			d := discover(t, sim)[0]
			if len(sim.Devices()[0].GetAttributesCalls()) == 0 {
				t.Fatalf("discovery did not ask NVML for the SM count")
			}
			want := 1000 * spec.FP32TFLOPS
			if off := math.Abs(float64(d.FP32GFLOPS())-want) / want; off > 0.05 {
				t.Errorf("FP32 = %d GFLOPS (%d SMs at %d MHz, cc %s), %.1f%% off the datasheet's %.1f TFLOPS",
					d.FP32GFLOPS(), d.MultiprocessorCount, d.MaxSMClockMHz, d.CUDAComputeCapability, 100*off, spec.FP32TFLOPS)
			}
		})
	}
}

// The golden file is exactly what an HGX H100 node publishes.
func TestDiscoveredH100FleetGolden(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	sim := simulate(t, loadFleet(t, filepath.Join("testdata", "h100-sxm-8.yaml")), "node-a")
	devices := discover(t, sim)
	published, err := gpu.ResourceDevices(ctx, devices, gpu.PublishOptions{SysFS: sim.SysFS()})
	if err != nil {
		t.Fatalf("ResourceDevices: %v", err)
	}
	goldentest.Compare(t, filepath.Join("testdata", "h100-sxm-8.golden.json"), goldentest.JSON(t, published))
}

func TestNVLinkDomains(t *testing.T) {
	for name, tc := range map[string]struct {
		fleet string
		want  []*int
	}{
		"one NVSwitch island of eight": {
			fleet: filepath.Join("testdata", "h100-sxm-8.yaml"),
			want:  []*int{ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0)},
		},
		"two switch islands, a bridged pair, and a GPU without NVLink": {
			fleet: filepath.Join("testdata", "islands.yaml"),
			want: []*int{ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(0), ptr.To(1), ptr.To(1), ptr.To(1), ptr.To(1),
				ptr.To(2), ptr.To(2), nil},
		},
		"mixed node": {
			fleet: filepath.Join("..", "..", "..", "demo", "fleets", "mixed.yaml"),
			want:  []*int{ptr.To(0), ptr.To(0), ptr.To(1), ptr.To(1), nil, nil, nil, nil},
		},
	} {
		t.Run(name, func(t *testing.T) {
			devices := discover(t, simulate(t, loadFleet(t, tc.fleet), "node-a"))
			if got, want := domains(devices), render(tc.want); got != want {
				t.Errorf("nvlinkDomain by index = %s, want %s", got, want)
			}
		})
	}
}

// Domains are numbered by their lowest GPU index whatever order the
// devices arrive in, and a switch port shared by two GPUs joins them.
func TestAssignNVLinkDomainsNumbersByLowestIndex(t *testing.T) {
	devices := []gpu.Device{
		{Index: 3, PCIBusID: "0000:04:00.0"},
		{Index: 2, PCIBusID: "0000:03:00.0"},
		{Index: 1, PCIBusID: "0000:02:00.0"},
		{Index: 0, PCIBusID: "0000:01:00.0"},
	}
	links := [][]string{
		{"0100:01:00.0"},                 // gpu-3 to a switch
		{"0000:02:00.0"},                 // gpu-2 bridged to gpu-1
		{"0000:03:00.0"},                 // gpu-1 bridged to gpu-2
		{"0100:02:00.0", "0100:01:00.0"}, // gpu-0 to both switch ports
	}
	assignNVLinkDomains(devices, links)
	if got, want := domains(devices), "[0 1 1 0]"; got != want {
		t.Errorf("nvlinkDomain in input order (gpu-3..gpu-0) = %s, want %s", got, want)
	}
}

func TestDiscoverReturnsDevicesInIndexOrder(t *testing.T) {
	devices := discover(t, simulate(t, loadFleet(t, filepath.Join("..", "..", "..", "demo", "fleets", "mixed.yaml")), "node-a"))
	wantProducts := []string{"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe",
		"NVIDIA L4", "NVIDIA L4", "Tesla T4", "Tesla T4"}
	if len(devices) != len(wantProducts) {
		t.Fatalf("discovered %d devices, want %d", len(devices), len(wantProducts))
	}
	for i, d := range devices {
		if d.Index != i || d.Name() != fmt.Sprintf("gpu-%d", i) || d.ProductName != wantProducts[i] {
			t.Errorf("devices[%d] = %s %s (index %d), want gpu-%d %s", i, d.Name(), d.ProductName, d.Index, i, wantProducts[i])
		}
	}
}

func TestDiscoverNormalisesVersions(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	devices := discover(t, simulate(t, loadFleet(t, filepath.Join("..", "..", "..", "demo", "fleets", "t4-2.yaml")), "node-a"))
	if devices[0].DriverVersion != "535.104.05" || devices[0].CUDADriverVersion != "12.2" {
		t.Errorf("discovered driver %q, CUDA %q; want NVML's own spelling 535.104.05 and 12.2", devices[0].DriverVersion, devices[0].CUDADriverVersion)
	}
	rd, err := devices[0].ResourceDevice(ctx, gpu.PublishOptions{})
	if err != nil {
		t.Fatalf("ResourceDevice: %v", err)
	}
	for id, want := range map[string]string{"driverVersion": "535.104.5", "cudaDriverVersion": "12.2.0", "cudaComputeCapability": "7.5.0"} {
		v := rd.Attributes[qualified(id)].VersionValue
		if v == nil || *v != want {
			t.Errorf("%s = %v, want version %s", id, v, want)
		}
	}
	if _, ok := rd.Attributes[qualified("numaNode")]; ok {
		t.Errorf("numaNode published for a fleet that reports no NUMA affinity")
	}
}

// A board or driver that cannot answer a call must not stop discovery:
// the spec table fills in what it can, the rest is left unknown.
func TestDiscoverFallsBackWhenNVMLCannotAnswer(t *testing.T) {
	notSupported := func(sim *Simulated, product string) {
		d := sim.Devices()[0]
		d.GetNameFunc = func() (string, nvml.Return) { return product, nvml.SUCCESS }
		d.GetBrandFunc = func() (nvml.BrandType, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetArchitectureFunc = func() (nvml.DeviceArchitecture, nvml.Return) { return 0, nvml.ERROR_FUNCTION_NOT_FOUND }
		d.GetCudaComputeCapabilityFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_NOT_SUPPORTED }
		d.GetMemoryBusWidthFunc = func() (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetMaxClockInfoFunc = func(nvml.ClockType) (uint32, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetAttributesFunc = func() (nvml.DeviceAttributes, nvml.Return) { return nvml.DeviceAttributes{}, nvml.ERROR_NOT_SUPPORTED }
		d.GetMaxPcieLinkGenerationFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }
		d.GetMaxPcieLinkWidthFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
		d.GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
		d.GetNumaNodeIdFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_NOT_SUPPORTED }
	}

	t.Run("known product takes the spec table", func(t *testing.T) {
		sim := simulate(t, oneOf("NVIDIA H100 80GB HBM3"), "node-a")
		notSupported(sim, "NVIDIA H100 80GB HBM3")
		d := discover(t, sim)[0]
		spec, _ := gpu.LookupSpec("NVIDIA H100 80GB HBM3")
		want := gpu.Device{
			UUID: d.UUID, PCIBusID: d.PCIBusID, DriverVersion: "550.54.15", CUDADriverVersion: "12.4",
			ProductName: spec.Product, Brand: spec.Brand, Architecture: spec.Architecture,
			CUDAComputeCapability: spec.ComputeCapability, MemoryBytes: spec.MemoryBytes(),
			MemoryBusWidthBits: spec.MemoryBusWidthBits, MaxMemoryClockMHz: spec.MaxMemoryClockMHz,
			MaxSMClockMHz: spec.MaxSMClockMHz, MultiprocessorCount: spec.MultiprocessorCount,
			PCIeGeneration: spec.PCIeGeneration, PCIeLinkWidth: spec.PCIeLinkWidth, MIGCapable: true,
		}
		if diff := cmp.Diff(string(goldentest.JSON(t, want)), string(goldentest.JSON(t, d))); diff != "" {
			t.Errorf("discovered device differs (-want +got):\n%s", diff)
		}
	})

	t.Run("unknown product leaves the fields unknown", func(t *testing.T) {
		_, ctx := ktesting.NewTestContext(t)
		sim := simulate(t, oneOf("NVIDIA H100 80GB HBM3"), "node-a")
		notSupported(sim, "NVIDIA Imaginary 9000")
		d := discover(t, sim)[0]
		if d.MemoryBandwidthGBps() != 0 || d.FP32GFLOPS() != 0 || d.Architecture != "" || d.NUMANode != nil {
			t.Errorf("discovered %+v, want unknown figures left zero", d)
		}
		rd, err := d.ResourceDevice(ctx, gpu.PublishOptions{})
		if err != nil {
			t.Fatalf("ResourceDevice: %v", err)
		}
		for _, id := range []string{"memoryBandwidthGBps", "bandwidthClass", "fp32GFLOPS", "fp16TensorTFLOPS", "multiprocessorCount", "architecture", "numaNode"} {
			if v, ok := rd.Attributes[qualified(id)]; ok {
				t.Errorf("published %s = %+v for an unknown figure", id, v)
			}
		}
		if c, ok := rd.Capacity[qualified("memory")]; ok {
			t.Errorf("published memory capacity %s for an unknown size", c.Value.String())
		}
	})
}

// discoverBroken discovers a node of two T4s after break_ has made some
// NVML call fail.
func discoverBroken(t *testing.T, break_ func(sim *Simulated)) ([]gpu.Device, error) {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	sim := simulate(t, &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040, GPUs: []GPUGroup{{Product: "Tesla T4", Count: 2}}}, "node-a")
	break_(sim)
	return Discover(ctx, sim, Options{})
}

// TestUnreadableGPUIsLeftOutAlone: a GPU whose identity NVML cannot read
// is reported, and the others are still returned.
func TestUnreadableGPUIsLeftOutAlone(t *testing.T) {
	for call, tc := range map[string]struct {
		break_  func(sim *Simulated)
		broken  int
		wantErr string
	}{
		"UUID": {
			break_: func(sim *Simulated) {
				sim.Devices()[1].GetUUIDFunc = func() (string, nvml.Return) { return "", nvml.ERROR_GPU_IS_LOST }
			},
			broken:  1,
			wantErr: "reading GPU 1: getting UUID",
		},
		"PCI info": {
			break_: func(sim *Simulated) {
				sim.Devices()[0].GetPciInfoFunc = func() (nvml.PciInfo, nvml.Return) { return nvml.PciInfo{}, nvml.ERROR_UNKNOWN }
			},
			broken:  0,
			wantErr: "reading GPU 0: getting PCI info",
		},
		"handle": {
			break_: func(sim *Simulated) {
				handle := sim.DeviceGetHandleByIndexFunc
				sim.DeviceGetHandleByIndexFunc = func(i int) (nvml.Device, nvml.Return) {
					if i == 1 {
						return nil, nvml.ERROR_GPU_IS_LOST
					}
					return handle(i)
				}
			},
			broken:  1,
			wantErr: "reading GPU 1: getting handle",
		},
	} {
		t.Run(call, func(t *testing.T) {
			devices, err := discoverBroken(t, tc.break_)
			var unreadable *UnreadableError
			if !errors.As(err, &unreadable) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Discover error %v; want an UnreadableError containing %q", err, tc.wantErr)
			}
			if _, ok := unreadable.GPUs[tc.broken]; !ok || len(unreadable.GPUs) != 1 {
				t.Errorf("unreadable GPUs %v, want only %d", unreadable.GPUs, tc.broken)
			}
			if len(devices) != 1 || devices[0].Index == tc.broken {
				t.Errorf("Discover returned %+v, want only the readable GPU", devices)
			}
		})
	}
}

func TestDiscoverFailsWithoutNVML(t *testing.T) {
	for call, tc := range map[string]struct {
		break_  func(sim *Simulated)
		wantErr string
	}{
		"device count": {
			break_: func(sim *Simulated) {
				sim.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNINITIALIZED }
			},
			wantErr: "counting GPUs",
		},
		"init": {
			break_:  func(sim *Simulated) { sim.InitFunc = func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED } },
			wantErr: "initializing NVML",
		},
	} {
		t.Run(call, func(t *testing.T) {
			devices, err := discoverBroken(t, tc.break_)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Discover = %d devices, %v; want error containing %q", len(devices), err, tc.wantErr)
			}
		})
	}
}

func TestSimulatedUUIDs(t *testing.T) {
	f := loadFleet(t, filepath.Join("testdata", "h100-sxm-8.yaml"))
	uuids := func(node string) []string {
		var out []string
		for _, d := range discover(t, simulate(t, f, node)) {
			out = append(out, d.UUID)
		}
		return out
	}
	a, again, b := uuids("node-a"), uuids("node-a"), uuids("node-b")
	format := regexp.MustCompile(`^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	seen := map[string]bool{}
	for i := range a {
		if !format.MatchString(a[i]) {
			t.Errorf("UUID %q does not look like an NVML GPU UUID", a[i])
		}
		if a[i] != again[i] {
			t.Errorf("gpu-%d: UUID changed across restarts of the same node: %s, %s", i, a[i], again[i])
		}
		seen[a[i]], seen[b[i]] = true, true
	}
	if len(seen) != len(a)+len(b) {
		t.Errorf("UUIDs repeat within or across nodes: %q and %q", a, b)
	}
	if _, err := NewSimulated(f, ""); err == nil {
		t.Errorf("NewSimulated accepted an empty node name")
	}
}

func TestSimulatedHandleByUUID(t *testing.T) {
	sim := simulate(t, loadFleet(t, filepath.Join("testdata", "h100-sxm-8.yaml")), "node-a")
	devices := discover(t, sim)
	h, ret := sim.DeviceGetHandleByUUID(devices[5].UUID)
	if ret != nvml.SUCCESS || h != sim.Devices()[5] {
		t.Errorf("DeviceGetHandleByUUID(gpu-5's UUID) = %v, %v; want the gpu-5 mock", h, ret)
	}
	if _, ret := sim.DeviceGetHandleByUUID("GPU-nope"); ret != nvml.ERROR_NOT_FOUND {
		t.Errorf("DeviceGetHandleByUUID(unknown) = %v, want ERROR_NOT_FOUND", ret)
	}
}

func TestBusIDSpelling(t *testing.T) {
	for nvmlID, want := range map[string]string{
		"00000000:07:00.0": "0000:07:00.0",
		"00000001:A1:1F.3": "0001:a1:1f.3",
		"0000:07:00.0":     "0000:07:00.0",
		"garbage":          "garbage",
	} {
		var info nvml.PciInfo
		for i := range nvmlID {
			info.BusId[i] = int8(nvmlID[i])
		}
		if got := busID(info); got != want {
			t.Errorf("busID(%q) = %q, want %q", nvmlID, got, want)
		}
	}
}

func domains(devices []gpu.Device) string {
	var out []*int
	for _, d := range devices {
		out = append(out, d.NVLinkDomain)
	}
	return render(out)
}

func render(ds []*int) string {
	var parts []string
	for _, d := range ds {
		if d == nil {
			parts = append(parts, "-")
		} else {
			parts = append(parts, fmt.Sprint(*d))
		}
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func qualified(id string) resourceapi.QualifiedName {
	return resourceapi.QualifiedName(gpuv1alpha1.DriverName + "/" + id)
}
