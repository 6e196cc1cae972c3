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
	"path/filepath"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/google/go-cmp/cmp"
	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/goldentest"
	"github.com/prismgpu/prism/pkg/gpu"
)

func inMIGMode(product string) *Fleet {
	f := oneOf(product)
	f.GPUs[0].MIGMode = true
	return f
}

// What discovery reads from NVML on a GPU in MIG mode, and the ResourceSlices
// built from it, are pinned per board: the profiles (names derived from
// NVML's figures), their placements, the counter set and every partition's
// consumption and attributes.
func TestMIGDiscoveryPerBoard(t *testing.T) {
	for _, tc := range []struct {
		product, golden string
		profiles        []string
	}{
		{"NVIDIA A100-SXM4-40GB", "mig-a100-40gb.golden.json",
			[]string{"1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"}},
		{"NVIDIA A100-SXM4-80GB", "mig-a100-80gb.golden.json",
			[]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
		{"NVIDIA H100 80GB HBM3", "mig-h100-80gb.golden.json",
			[]string{"1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"}},
	} {
		t.Run(tc.product, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			devices := discover(t, simulate(t, inMIGMode(tc.product), "node-a"))
			d := devices[0]
			if d.MIG == nil {
				t.Fatalf("GPU in MIG mode discovered without profiles")
			}
			var names []string
			for _, p := range d.MIG.Profiles {
				names = append(names, p.Name)
			}
			if diff := cmp.Diff(tc.profiles, names); diff != "" {
				t.Errorf("profile names (-want +got):\n%s", diff)
			}
			if note := d.MIGNote(); note != "" {
				t.Errorf("MIGNote on a GPU in MIG mode = %q, want none", note)
			}
			slices, err := gpu.ResourceSlices(ctx, devices, gpu.PublishOptions{})
			if err != nil {
				t.Fatalf("ResourceSlices: %v", err)
			}
			goldentest.Compare(t, filepath.Join("testdata", tc.golden), goldentest.JSON(t, struct {
				Profiles []gpu.MIGProfile
				Slices   []gpu.Slice
			}{d.MIG.Profiles, slices}))
		})
	}
}

// A MIG-capable GPU whose mode is off is discovered without partitions and
// with a note for the operator; a GPU that cannot do MIG gets no note.
func TestMIGModeOffIsPublishedWholeWithANote(t *testing.T) {
	for _, tc := range []struct {
		fleet    *Fleet
		wantNote bool
	}{
		{oneOf("NVIDIA A100-SXM4-40GB"), true},
		{oneOf("NVIDIA H100 80GB HBM3"), true},
		{oneOf("Tesla T4"), false},
		{inMIGMode("NVIDIA H100 80GB HBM3"), false},
	} {
		d := discover(t, simulate(t, tc.fleet, "node-a"))[0]
		note := d.MIGNote()
		if got := note != ""; got != tc.wantNote {
			t.Errorf("%s: MIGNote = %q, want a note: %v", d.ProductName, note, tc.wantNote)
		}
		if tc.wantNote && (d.MIG != nil || !strings.Contains(note, "never changes the MIG mode")) {
			t.Errorf("%s: MIG = %v, note %q; want no partitions and a note that says the mode is the operator's", d.ProductName, d.MIG, note)
		}
	}
}

// A GPU whose enable is pending a reset is not yet in MIG mode, and
// discovery never sets the mode, whatever it finds.
func TestDiscoveryOnlyReadsMIGMode(t *testing.T) {
	for _, mode := range []struct{ current, pending int }{
		{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_ENABLE},
		{nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE},
		{nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE},
	} {
		sim := simulate(t, inMIGMode("NVIDIA A100-SXM4-40GB"), "node-a")
		dev := sim.Devices()[0]
		dev.GetMigModeFunc = func() (int, int, nvml.Return) { return mode.current, mode.pending, nvml.SUCCESS }
		dev.SetMigModeFunc = func(int) (nvml.Return, nvml.Return) {
			t.Errorf("discovery set the MIG mode")
			return nvml.SUCCESS, nvml.SUCCESS
		}
		d := discover(t, sim)[0]
		if got, want := d.MIG != nil, mode.current == nvml.DEVICE_MIG_ENABLE; got != want {
			t.Errorf("mode %+v: partitions read = %v, want %v", mode, got, want)
		}
	}
}

func TestFleetMIGModeNeedsAKnownBoard(t *testing.T) {
	f := inMIGMode("Tesla T4")
	err := f.Validate()
	if err == nil || !strings.Contains(err.Error(), "gpus[0].migMode") {
		t.Errorf("Validate() = %v, want an error on gpus[0].migMode", err)
	}
	if err := inMIGMode("NVIDIA A100-SXM4-80GB").Validate(); err != nil {
		t.Errorf("Validate() of an A100 in MIG mode = %v", err)
	}
}

// No simulated MIG profile holds more memory than its whole GPU reports:
// on a real H100 the full-GPU profile (7g.80gb, 81152 MiB) is a little
// less than the 81559 MiB NVML reports for the GPU.
func TestSimulatedMIGProfilesFitTheirGPU(t *testing.T) {
	for product, profiles := range simulatedMIGProfiles {
		spec, ok := gpu.LookupSpec(product)
		if !ok {
			t.Errorf("%s: MIG profiles but no spec", product)
			continue
		}
		for _, p := range profiles {
			if got := p.info.MemorySizeMB << 20; got > spec.MemoryBytes() {
				t.Errorf("%s: profile index %d has %d MiB, more than the GPU's %d bytes", product, p.index, p.info.MemorySizeMB, spec.MemoryBytes())
			}
		}
	}
}
