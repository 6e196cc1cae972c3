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
	"os"
	"path/filepath"
	"strings"
	"testing"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/gpu"
)

// The records of real GPUs under testdata/real/ were written by the
// gpu-tagged tests on the GPU (hack/gpu-check.sh); the tests here hold the
// simulator to them on every run, where no GPU is.

// TestSimulatorPublishesWhatARealGPUPublishes: a simulated GPU of a model
// that has run for real publishes the same device as the real one, but for
// the values that tell two cards apart.
func TestSimulatorPublishesWhatARealGPUPublishes(t *testing.T) {
	forEachRecord(t, "*.golden.json", "golden", func(t *testing.T, path string) {
		_, ctx := ktesting.NewTestContext(t)
		var want resourceapi.Device
		readRecord(t, path, &want)
		product := *want.Attributes[gpuv1alpha1.ProductNameAttribute.Qualified()].StringValue
		sim := simulate(t, oneOf(product), "node-a")
		devices := discover(t, sim)
		published, err := gpu.ResourceDevices(ctx, devices, gpu.PublishOptions{SysFS: sim.SysFS()})
		if err != nil {
			t.Fatalf("ResourceDevices: %v", err)
		}
		if diff := cmp.Diff(want, blankPerCard(published[0])); diff != "" {
			t.Errorf("the simulated %s publishes another device than the real one (-real +simulated):\n%s", product, diff)
		}
	})
}

// TestSimulatedMIGProfilesAreTheRealOnes holds the simulator's MIG profile
// tables to what NVML answered on real GPUs.
func TestSimulatedMIGProfilesAreTheRealOnes(t *testing.T) {
	forEachRecord(t, "*.mig.json", "MIG record", func(t *testing.T, path string) {
		var recs []realMIGRecord
		readRecord(t, path, &recs)
		for _, rec := range recs {
			if _, ok := simulatedMIGProfiles[rec.Product]; !ok {
				t.Errorf("the simulator has no MIG profiles for %q, which has a real record", rec.Product)
				continue
			}
			compareSimulatedMIG(t, gpu.Device{ProductName: rec.Product}, rec)
		}
	})
}

// forEachRecord runs test on each record of a real GPU under testdata/real
// whose name matches pattern, and fails when there is none: what names the
// kind of record in that failure.
func forEachRecord(t *testing.T, pattern, what string, test func(t *testing.T, path string)) {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join("testdata", "real", pattern))
	if err != nil || len(paths) == 0 {
		t.Fatalf("no %s of a real GPU under testdata/real (%v)", what, err)
	}
	for _, path := range paths {
		t.Run(filepath.Base(path), func(t *testing.T) { test(t, path) })
	}
}

func readRecord(t *testing.T, path string, into any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, into); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// perCardAttributes differ between two cards of one model, between two
// slots of one host, or between two driver installs: they are blanked in
// the golden so that the golden of a model pins what every card of that
// model publishes, whichever driver the next run finds.
var perCardAttributes = []resourceapi.QualifiedName{
	gpuv1alpha1.DriverVersionAttribute.Qualified(),
	gpuv1alpha1.CUDADriverVersionAttribute.Qualified(),
	gpuv1alpha1.UUIDAttribute.Qualified(),
	gpuv1alpha1.IndexAttribute.Qualified(),
	gpuv1alpha1.MinorAttribute.Qualified(),
	gpuv1alpha1.NUMANodeAttribute.Qualified(),
	gpuv1alpha1.NVLinkDomainAttribute.Qualified(),
	deviceattribute.StandardDeviceAttributePCIBusID,
	deviceattribute.StandardDeviceAttributePCIeRoot,
}

// perCardString and perCardInt replace blanked values; the type is kept so
// that the golden still says what kind of value each attribute has.
const (
	perCardString = "(per card)"
	perCardInt    = -1
)

// blankPerCard returns a copy of rd without the values that tell two cards
// of one model apart.
func blankPerCard(rd resourceapi.Device) resourceapi.Device {
	out := *rd.DeepCopy()
	out.Name = perCardString
	for _, name := range perCardAttributes {
		v, ok := out.Attributes[name]
		if !ok {
			continue
		}
		switch {
		case v.StringValue != nil:
			v.StringValue = ptr.To(perCardString)
		case v.IntValue != nil:
			v.IntValue = ptr.To(int64(perCardInt))
		case v.VersionValue != nil:
			v.VersionValue = ptr.To("0.0.0")
		}
		out.Attributes[name] = v
	}
	return out
}

// productSlug spells a product name as a file name:
// "NVIDIA H100 80GB HBM3" is "nvidia-h100-80gb-hbm3".
func productSlug(product string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(product) {
		if ('a' <= r && r <= 'z') || ('0' <= r && r <= '9') {
			b.WriteRune(r)
			dash = false
			continue
		}
		if !dash && b.Len() > 0 {
			b.WriteByte('-')
			dash = true
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}

// realMIGRecord is what NVML answers about one GPU's MIG support.
type realMIGRecord struct {
	GPU     string `json:"gpu"`
	Product string `json:"product"`
	// MigModeReturn is NVML's answer to nvmlDeviceGetMigMode;
	// ERROR_NOT_SUPPORTED means the GPU cannot do MIG.
	MigModeReturn string `json:"migModeReturn"`
	Current       *int   `json:"current,omitempty"`
	Pending       *int   `json:"pending,omitempty"`
	// Skipped are the profile indices NVML did not answer, with its return.
	Skipped  map[int]string         `json:"skipped,omitempty"`
	Profiles []realMIGProfileRecord `json:"profiles"`
}

type realMIGProfileRecord struct {
	Index int `json:"index"`
	realMIGFields
	// Name is NVML's own (profile info v3, else v2) with its "MIG " prefix
	// removed, or empty when neither version answers.
	Name       string `json:"name,omitempty"`
	NameSource string `json:"nameSource"`
	// PrismName is what discovery derives from the v1 figures and publishes.
	PrismName        string             `json:"prismName"`
	Placements       []gpu.MIGPlacement `json:"placements,omitempty"`
	PlacementsReturn string             `json:"placementsReturn"`
}

// realMIGFields are the figures of a profile that the simulator models
// (simulated_mig.go), so the ones compared with it.
type realMIGFields struct {
	ID            int    `json:"id"`
	SliceCount    int    `json:"sliceCount"`
	InstanceCount int    `json:"instanceCount"`
	SMs           int    `json:"multiprocessorCount"`
	MemoryMiB     uint64 `json:"memoryMiB"`
	CopyEngines   int    `json:"copyEngines"`
	Decoders      int    `json:"decoders"`
	Encoders      int    `json:"encoders"`
	JPEGDecoders  int    `json:"jpegDecoders"`
	OFAs          int    `json:"ofas"`
}

func migFields(info nvml.GpuInstanceProfileInfo) realMIGFields {
	return realMIGFields{
		ID: int(info.Id), SliceCount: int(info.SliceCount), InstanceCount: int(info.InstanceCount),
		SMs: int(info.MultiprocessorCount), MemoryMiB: info.MemorySizeMB,
		CopyEngines: int(info.CopyEngineCount), Decoders: int(info.DecoderCount), Encoders: int(info.EncoderCount),
		JPEGDecoders: int(info.JpegCount), OFAs: int(info.OfaCount),
	}
}

// compareSimulatedMIG holds the simulator's profile table for the product,
// if it simulates MIG on it, to what the real GPU answered: the set of
// profile indices and the figures the table models, and the placements when
// NVML gave them (it may not while MIG mode is off).
func compareSimulatedMIG(t *testing.T, d gpu.Device, rec realMIGRecord) {
	t.Helper()
	simulated, ok := simulatedMIGProfiles[d.ProductName]
	if !ok {
		t.Logf("%s: the simulator does not put %q in MIG mode; nothing to compare", d.Name(), d.ProductName)
		return
	}
	if len(rec.Profiles) == 0 {
		t.Logf("%s: NVML lists no GPU-instance profile (MIG mode %s, current %v); the simulator's %d profiles for %q cannot be compared on this run",
			d.Name(), rec.MigModeReturn, derefOr(rec.Current, -1), len(simulated), d.ProductName)
		return
	}
	want := map[int]realMIGFields{}
	wantPlacements := map[int][]gpu.MIGPlacement{}
	for _, p := range simulated {
		want[p.index] = migFields(p.info)
		for _, pl := range p.placements {
			wantPlacements[p.index] = append(wantPlacements[p.index], gpu.MIGPlacement{Start: int(pl.Start), Size: int(pl.Size)})
		}
	}
	got := map[int]realMIGFields{}
	gotPlacements := map[int][]gpu.MIGPlacement{}
	for _, p := range rec.Profiles {
		got[p.Index] = p.realMIGFields
		if len(p.Placements) > 0 {
			gotPlacements[p.Index] = p.Placements
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("%s: the simulator's MIG profiles for %q (simulated_mig.go) differ from the real GPU's, by profile index (-simulated +real):\n%s",
			d.Name(), d.ProductName, diff)
	} else {
		t.Logf("%s: the simulator's %d MIG profiles for %q match the real GPU's", d.Name(), len(simulated), d.ProductName)
	}
	if len(gotPlacements) == 0 {
		t.Logf("%s: NVML gave no placements; the simulator's are not compared", d.Name())
		return
	}
	for index := range wantPlacements {
		if _, ok := gotPlacements[index]; !ok {
			delete(wantPlacements, index)
		}
	}
	if diff := cmp.Diff(wantPlacements, gotPlacements); diff != "" {
		t.Errorf("%s: the simulator's MIG placements for %q differ from the real GPU's, by profile index (-simulated +real):\n%s",
			d.Name(), d.ProductName, diff)
	}
}

func derefOr(p *int, def int) int {
	if p == nil {
		return def
	}
	return *p
}
