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
	"encoding/json"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/gpu"
)

// realDatasheet is what NVIDIA's datasheets give for the boards Prism has
// been run on, by NVML product name. The published figures are computed
// from NVML's clocks and widths, so this is the check that the arithmetic
// (two transfers per memory clock, FP32 lanes per SM) matches the vendor.
var realDatasheet = map[string]struct {
	bandwidthGBps float64
	fp32TFLOPS    float64
}{
	"NVIDIA H100 80GB HBM3": {bandwidthGBps: 3352, fp32TFLOPS: 66.9}, // SXM5
	"NVIDIA H100 PCIe":      {bandwidthGBps: 2039, fp32TFLOPS: 51.2},
	"NVIDIA H200":           {bandwidthGBps: 4800, fp32TFLOPS: 66.9},
	"NVIDIA A100-SXM4-80GB": {bandwidthGBps: 2039, fp32TFLOPS: 19.5},
	"NVIDIA A100-SXM4-40GB": {bandwidthGBps: 1555, fp32TFLOPS: 19.5},
	"NVIDIA A100 80GB PCIe": {bandwidthGBps: 1935, fp32TFLOPS: 19.5},
}

// realDatasheetTolerance is the bound on how far a published figure
// may be from the datasheet.
const realDatasheetTolerance = 0.05

// TestRealNVML runs discovery against the host's driver:
//
//	go test -tags gpu -run TestRealNVML -v ./pkg/gpu/nvml/
//
// PRISM_DRIVER_ROOT overrides the driver root (default "/"). Records go to
// $PRISM_GPU_OUT/nvml: <gpu>.device.json (the device as published),
// <product>.published.json (the same with per-card values blanked, the
// golden to commit as testdata/real/<product>.golden.json) and mig.json
// (what NVML answers about MIG, read-only).
func TestRealNVML(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := os.Getenv("PRISM_DRIVER_ROOT")
	if root == "" {
		root = "/"
	}
	out := realOutDir(t, "nvml")
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
	if len(published) != len(devices) {
		t.Fatalf("ResourceDevices built %d devices for %d GPUs", len(published), len(devices))
	}
	for i, d := range devices {
		t.Logf("%s: %s, %d bits at %d MHz memory, %d SMs at %d MHz, compute capability %s, MIG capable %t",
			d.Name(), d.ProductName, d.MemoryBusWidthBits, d.MaxMemoryClockMHz, d.MultiprocessorCount, d.MaxSMClockMHz,
			d.CUDAComputeCapability, d.MIGCapable)
		rd := published[i]
		if rd.Name != d.Name() {
			t.Fatalf("published device %d is %s, want %s", i, rd.Name, d.Name())
		}
		logPublished(t, rd)
		checkDatasheet(t, d)
		writeJSON(t, filepath.Join(out, d.Name()+".device.json"), rd)
		checkPublishedGolden(t, out, d.ProductName, rd)
	}

	recordMIG(t, lib, devices, out)
}

func logPublished(t *testing.T, rd resourceapi.Device) {
	t.Helper()
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
}

// checkDatasheet holds the published bandwidth and FP32 figures to the
// datasheet within realDatasheetTolerance.
func checkDatasheet(t *testing.T, d gpu.Device) {
	t.Helper()
	row, ok := realDatasheet[d.ProductName]
	if !ok {
		t.Errorf("%s: product %q has no datasheet row; add its bandwidth (GB/s) and FP32 (TFLOPS) to realDatasheet so the 5%% check covers it (published %d GB/s, %d GFLOPS)",
			d.Name(), d.ProductName, d.MemoryBandwidthGBps(), d.FP32GFLOPS())
		return
	}
	for _, f := range []struct {
		what      string
		published float64
		datasheet float64
		unit      string
	}{
		{"memory bandwidth", float64(d.MemoryBandwidthGBps()), row.bandwidthGBps, "GB/s"},
		{"FP32", float64(d.FP32GFLOPS()) / 1000, row.fp32TFLOPS, "TFLOPS"},
	} {
		off := (f.published - f.datasheet) / f.datasheet
		t.Logf("%s: %s published %.1f %s, datasheet %.1f %s, %+.2f%% off", d.Name(), f.what, f.published, f.unit, f.datasheet, f.unit, 100*off)
		if math.Abs(off) > realDatasheetTolerance {
			t.Errorf("%s (%s): published %s %.1f %s is %.1f%% off the datasheet's %.1f %s, more than %.0f%%",
				d.Name(), d.ProductName, f.what, f.published, f.unit, 100*math.Abs(off), f.datasheet, f.unit, 100*realDatasheetTolerance)
		}
	}
}

// checkPublishedGolden records the device with per-card values blanked and,
// when a golden for the model is committed, holds the device to it.
func checkPublishedGolden(t *testing.T, out, product string, rd resourceapi.Device) {
	t.Helper()
	slug := productSlug(product)
	blanked := blankPerCard(rd)
	got := writeJSON(t, filepath.Join(out, slug+".published.json"), blanked)

	golden := filepath.Join("testdata", "real", slug+".golden.json")
	abs, _ := filepath.Abs(golden)
	want, err := os.ReadFile(golden)
	if errors.Is(err, fs.ErrNotExist) {
		t.Logf("%s: no golden at %s yet; commit %s.published.json from the record there", rd.Name, abs, slug)
		return
	}
	if err != nil {
		t.Fatalf("reading golden: %v", err)
	}
	var wantV, gotV any
	if err := json.Unmarshal(want, &wantV); err != nil {
		t.Fatalf("golden %s is not JSON: %v", abs, err)
	}
	if err := json.Unmarshal(got, &gotV); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantV, gotV); diff != "" {
		t.Errorf("%s: published %s differs from the golden %s (-golden +published):\n%s", rd.Name, product, abs, diff)
	} else {
		t.Logf("%s: published device matches the golden %s", rd.Name, abs)
	}
}

// recordMIG reads, and only reads, what NVML says about MIG on each GPU,
// writes it to mig.json and holds the simulator's profile table for the
// product to it. It never changes the MIG mode or creates an instance.
func recordMIG(t *testing.T, lib nvml.Interface, devices []gpu.Device, out string) {
	t.Helper()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("initializing NVML for the MIG reads: %v", ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			t.Errorf("shutting down NVML: %v", ret)
		}
	}()
	var records []realMIGRecord
	for _, d := range devices {
		h, ret := lib.DeviceGetHandleByUUID(d.UUID)
		if ret != nvml.SUCCESS {
			t.Fatalf("%s: getting handle of %s: %v", d.Name(), d.UUID, ret)
		}
		rec := readMIGRecord(t, h, d)
		records = append(records, rec)
		compareSimulatedMIG(t, d, rec)
	}
	writeJSON(t, filepath.Join(out, "mig.json"), records)
}

func readMIGRecord(t *testing.T, h nvml.Device, d gpu.Device) realMIGRecord {
	t.Helper()
	rec := realMIGRecord{GPU: d.Name(), Product: d.ProductName, Skipped: map[int]string{}}
	current, pending, ret := h.GetMigMode()
	rec.MigModeReturn = ret.String()
	if ret == nvml.SUCCESS {
		rec.Current, rec.Pending = ptr.To(current), ptr.To(pending)
		t.Logf("%s: MIG mode current %d, pending %d (1 is enabled)", d.Name(), current, pending)
	} else {
		t.Logf("%s: GetMigMode: %v", d.Name(), ret)
	}

	for index := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			rec.Skipped[index] = ret.String()
			if ret != nvml.ERROR_NOT_SUPPORTED && ret != nvml.ERROR_INVALID_ARGUMENT {
				t.Logf("%s: GetGpuInstanceProfileInfo(%d): %v", d.Name(), index, ret)
			}
			continue
		}
		p := realMIGProfileRecord{
			Index:         index,
			realMIGFields: migFields(info),
			PrismName:     profileName(index, info, d.MemoryBytes),
			NameSource:    "none",
		}
		if v3, ret := h.GetGpuInstanceProfileInfoV(index).V3(); ret == nvml.SUCCESS {
			p.Name, p.NameSource = nvmlProfileName(v3.Name[:]), "v3"
		} else if v2, ret2 := h.GetGpuInstanceProfileInfoV(index).V2(); ret2 == nvml.SUCCESS {
			p.Name, p.NameSource = nvmlProfileName(v2.Name[:]), "v2"
		} else {
			t.Logf("%s: profile %d has no NVML name (v3: %v, v2: %v)", d.Name(), index, ret, ret2)
		}
		placements, ret := h.GetGpuInstancePossiblePlacements(&info)
		p.PlacementsReturn = ret.String()
		if ret == nvml.SUCCESS {
			for _, pl := range placements {
				p.Placements = append(p.Placements, gpu.MIGPlacement{Start: int(pl.Start), Size: int(pl.Size)})
			}
		}
		t.Logf("%s: MIG profile %d %q (Prism: %q): id %d, %d slices, %d instances, %d SMs, %d MiB, CE %d, DEC %d, ENC %d, JPG %d, OFA %d, placements %v (%s)",
			d.Name(), index, p.Name, p.PrismName, p.ID, p.SliceCount, p.InstanceCount, p.SMs, p.MemoryMiB,
			p.CopyEngines, p.Decoders, p.Encoders, p.JPEGDecoders, p.OFAs, p.Placements, p.PlacementsReturn)
		// The published partition names come from profileName; NVML's own
		// name is the reference they must match.
		if p.Name != "" && p.Name != p.PrismName {
			t.Errorf("%s: MIG profile %d: Prism derives the name %q, NVML names it %q", d.Name(), index, p.PrismName, p.Name)
		}
		rec.Profiles = append(rec.Profiles, p)
	}
	return rec
}

// nvmlProfileName reads NVML's C string, "MIG 1g.10gb", as Prism spells it.
func nvmlProfileName(raw []int8) string {
	b := make([]byte, 0, len(raw))
	for _, c := range raw {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return strings.TrimPrefix(strings.TrimSpace(string(b)), "MIG ")
}

// realOutDir is where a gpu-tagged test leaves its records:
// $PRISM_GPU_OUT/<sub>, or a directory discarded after the test.
func realOutDir(t *testing.T, sub string) string {
	t.Helper()
	base := os.Getenv("PRISM_GPU_OUT")
	if base == "" {
		base = t.TempDir()
		t.Logf("PRISM_GPU_OUT is not set; records go to %s and are discarded", base)
	}
	dir := filepath.Join(base, sub)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating record directory: %v", err)
	}
	return dir
}

// writeJSON writes v indented, with a final newline as a committed golden
// has, and returns what it wrote.
func writeJSON(t *testing.T, path string, v any) []byte {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("encoding %s: %v", path, err)
	}
	data = append(data, '\n')
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatalf("writing record: %v", err)
	}
	t.Logf("wrote %s", path)
	return data
}
