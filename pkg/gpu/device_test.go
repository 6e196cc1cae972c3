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
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// withBandwidth returns a device whose formula yields exactly gbps: a
// 4000-bit bus makes the bandwidth equal to the memory clock.
func withBandwidth(gbps int) Device {
	return Device{MemoryBusWidthBits: 4000, MaxMemoryClockMHz: gbps}
}

func TestMemoryBandwidthGBps(t *testing.T) {
	for name, tc := range map[string]struct {
		busWidth, memClock int
		want               int
	}{
		"H100 SXM: 5120 bits at 2619 MHz":  {5120, 2619, 3352},
		"T4: 256 bits at 5001 MHz":         {256, 5001, 320},
		"fractions are truncated":          {192, 6251, 300},
		"unknown clock means no bandwidth": {5120, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			d := Device{MemoryBusWidthBits: tc.busWidth, MaxMemoryClockMHz: tc.memClock}
			if got := d.MemoryBandwidthGBps(); got != tc.want {
				t.Errorf("MemoryBandwidthGBps() = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestBandwidthClassBoundaries(t *testing.T) {
	for _, tc := range []struct {
		gbps int
		want string
	}{
		{0, "low"},
		{499, "low"},
		{500, "mid"},
		{1199, "mid"},
		{1200, "high"},
		{2500, "high"},
		{2501, "ultra"},
		{8000, "ultra"},
	} {
		d := withBandwidth(tc.gbps)
		if d.MemoryBandwidthGBps() != tc.gbps {
			t.Fatalf("fixture for %d GB/s yields %d", tc.gbps, d.MemoryBandwidthGBps())
		}
		if got := d.BandwidthClass(); got != tc.want {
			t.Errorf("BandwidthClass() at %d GB/s = %q, want %q", tc.gbps, got, tc.want)
		}
	}
}

func TestFP32GFLOPS(t *testing.T) {
	for name, tc := range map[string]struct {
		cc       ComputeCapability
		sms, clk int
		want     int
	}{
		"Turing has 64 lanes per SM":          {ComputeCapability{7, 5}, 40, 1590, 8140},
		"GA100 has 64 lanes per SM":           {ComputeCapability{8, 0}, 108, 1410, 19491},
		"GA10x doubled FP32 to 128":           {ComputeCapability{8, 6}, 72, 1695, 31242},
		"Ada has 128 lanes per SM":            {ComputeCapability{8, 9}, 58, 2040, 30289},
		"Hopper has 128 lanes per SM":         {ComputeCapability{9, 0}, 132, 1980, 66908},
		"Blackwell has 128 lanes per SM":      {ComputeCapability{10, 0}, 148, 2112, 80019},
		"unknown capability yields no figure": {ComputeCapability{99, 0}, 132, 1980, 0},
		"unknown SM count yields no figure":   {ComputeCapability{9, 0}, 0, 1980, 0},
	} {
		t.Run(name, func(t *testing.T) {
			d := Device{CUDAComputeCapability: tc.cc, MultiprocessorCount: tc.sms, MaxSMClockMHz: tc.clk}
			if got := d.FP32GFLOPS(); got != tc.want {
				t.Errorf("FP32GFLOPS() = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestFP16TensorTFLOPSComesFromTheSpecTable(t *testing.T) {
	if got, ok := (Device{ProductName: "NVIDIA H100 80GB HBM3"}).FP16TensorTFLOPS(); !ok || got != 989 {
		t.Errorf("H100 SXM: FP16TensorTFLOPS() = %d, %v; want 989, true", got, ok)
	}
	if got, ok := (Device{ProductName: "NVIDIA Imaginary 9000"}).FP16TensorTFLOPS(); ok {
		t.Errorf("unknown product: FP16TensorTFLOPS() = %d, true; want absent", got)
	}
}

// The spec table's NVML-style figures must reproduce its own datasheet
// figures through the same formulas discovery uses, or the simulated
// fleets would publish numbers no real board has.
func TestSpecTableReproducesDatasheet(t *testing.T) {
	for _, s := range specs {
		t.Run(s.Product, func(t *testing.T) {
			d := Device{
				ProductName:           s.Product,
				CUDAComputeCapability: s.ComputeCapability,
				MemoryBusWidthBits:    s.MemoryBusWidthBits,
				MaxMemoryClockMHz:     s.MaxMemoryClockMHz,
				MaxSMClockMHz:         s.MaxSMClockMHz,
				MultiprocessorCount:   s.MultiprocessorCount,
			}
			if off := relDiff(float64(d.MemoryBandwidthGBps()), float64(s.BandwidthGBps)); off > 0.02 {
				t.Errorf("bandwidth %d GB/s is %.1f%% off the datasheet's %d", d.MemoryBandwidthGBps(), 100*off, s.BandwidthGBps)
			}
			if off := relDiff(float64(d.FP32GFLOPS()), 1000*s.FP32TFLOPS); off > 0.05 {
				t.Errorf("FP32 %d GFLOPS is %.1f%% off the datasheet's %.1f TFLOPS", d.FP32GFLOPS(), 100*off, s.FP32TFLOPS)
			}
		})
	}
}

// TestParseSpecs: the built-in table parses at init (or the package would
// not load); these are the mistakes an edit to it can make, each of which
// must stop the package rather than publish a wrong figure.
func TestParseSpecs(t *testing.T) {
	var columns []string
	for _, c := range specColumns {
		columns = append(columns, c.name)
	}
	header := strings.Join(columns, ",")
	const t4 = "Tesla T4, Turing, Tesla, 7.5, 16, GDDR6, 320, 8.1, 65, 40, 256, 5001, 1590, 3, 16, 0, false, 0"
	// Every figure differs from the others, so a value read into the wrong
	// field shows.
	const row = "Test GPU, Arch, Brand, 8.6, 24, HBM3, 900, 12.5, 150, 66, 384, 7001, 1800, 5, 8, 2, true, 23040"
	good, err := parseSpecs("# a comment\n" + header + "\n" + row + "\n")
	if err != nil {
		t.Fatalf("parseSpecs: %v", err)
	}
	want := Spec{
		Product: "Test GPU", Architecture: "Arch", Brand: "Brand",
		ComputeCapability: ComputeCapability{Major: 8, Minor: 6},
		MemoryGB:          24, MemoryType: "HBM3", BandwidthGBps: 900, FP32TFLOPS: 12.5, FP16TensorTFLOPS: 150,
		MultiprocessorCount: 66, MemoryBusWidthBits: 384, MaxMemoryClockMHz: 7001, MaxSMClockMHz: 1800,
		PCIeGeneration: 5, PCIeLinkWidth: 8, NVLinks: 2, MIGCapable: true, MemoryMiB: 23040,
	}
	if diff := cmp.Diff([]Spec{want}, good); diff != "" {
		t.Errorf("parseSpecs (-want +got):\n%s", diff)
	}
	for name, table := range map[string]string{
		"empty":                   "",
		"columns out of order":    strings.Replace(header, "product,architecture", "architecture,product", 1) + "\n",
		"missing column":          header + "\n" + strings.TrimSuffix(t4, ", 0") + "\n",
		"product twice":           header + "\n" + t4 + "\n" + t4 + "\n",
		"empty product":           header + "\n" + strings.Replace(t4, "Tesla T4", "", 1) + "\n",
		"compute capability":      header + "\n" + strings.Replace(t4, "7.5", "75", 1) + "\n",
		"zero bandwidth":          header + "\n" + strings.Replace(t4, "320", "0", 1) + "\n",
		"negative NVLinks":        header + "\n" + strings.Replace(t4, "16, 0, false", "16, -1, false", 1) + "\n",
		"zero FP32":               header + "\n" + strings.Replace(t4, "8.1", "0", 1) + "\n",
		"not a number":            header + "\n" + strings.Replace(t4, "5001", "5001MHz", 1) + "\n",
		"MIG capability not bool": header + "\n" + strings.Replace(t4, "false", "no", 1) + "\n",
	} {
		if got, err := parseSpecs(table); err == nil {
			t.Errorf("%s: parseSpecs = %+v, want an error", name, got)
		}
	}
}

func TestSortByIndex(t *testing.T) {
	devices := []Device{{Index: 3, UUID: "c"}, {Index: 0, UUID: "a"}, {Index: 10, UUID: "d"}, {Index: 1, UUID: "b"}}
	SortByIndex(devices)
	var got []string
	for _, d := range devices {
		got = append(got, d.Name())
	}
	if want := []string{"gpu-0", "gpu-1", "gpu-3", "gpu-10"}; !slices.Equal(got, want) {
		t.Errorf("order after SortByIndex = %q, want %q (numeric, not lexical)", got, want)
	}
}

func relDiff(got, want float64) float64 {
	return math.Abs(got-want) / want
}
