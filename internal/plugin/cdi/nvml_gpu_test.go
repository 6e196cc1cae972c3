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

package cdi

import (
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	gpunvml "github.com/prismgpu/prism/pkg/gpu/nvml"
)

// realClaimUID is the claim the real spec is written for.
const realClaimUID = "6a0f3c1e-7b2d-4e59-9c84-31d2a7e0b5f4"

// realEditsRecord is what nvcdi produced on the real driver, as the writer
// gets it from the source: host paths, hooks unresolved.
type realEditsRecord struct {
	DriverRoot  string                  `json:"driverRoot"`
	NVMLLibrary string                  `json:"nvmlLibrary"`
	Common      *cdispec.ContainerEdits `json:"common"`
	Devices     []realDeviceEditsRecord `json:"devices"`
}

type realDeviceEditsRecord struct {
	Name  string                  `json:"name"`
	UUID  string                  `json:"uuid"`
	Minor int                     `json:"minor"`
	Edits *cdispec.ContainerEdits `json:"edits"`
}

// TestNVMLSourceOnRealDriver runs the NVML edit source against the host's
// driver: every device node it names is a character device, every file it
// mounts exists, each GPU gets its own /dev/nvidiaN, and a claim over all
// GPUs is written and resolved through the CDI library as a runtime would.
// Hooks name nvidia-cdi-hook at DefaultNVIDIACDIHookPath, which the
// plugin's image installs and a bare host lacks, so they are only
// recorded. Records: $PRISM_GPU_OUT/cdi/edits.json and spec.json.
//
//	go test -tags gpu -run TestNVMLSourceOnRealDriver -v ./internal/plugin/cdi/
func TestNVMLSourceOnRealDriver(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := os.Getenv("PRISM_DRIVER_ROOT")
	if root == "" {
		root = "/"
	}
	out := realCDIOutDir(t)
	libPath := realNVMLLibrary(t)

	lib, err := gpunvml.New(ctx, root)
	if err != nil {
		t.Fatalf("loading NVML: %v", err)
	}
	gpus, err := gpunvml.Discover(ctx, lib, gpunvml.Options{})
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(gpus) == 0 {
		t.Fatal("NVML loaded but reports no GPUs")
	}

	roots := Roots{DriverRoot: root}
	src, err := NewNVMLSource(ctx, NVMLOptions{Roots: roots, NVMLLibraryPath: libPath})
	if err != nil {
		t.Fatalf("NewNVMLSource: %v", err)
	}
	common, err := src.CommonEdits(ctx)
	if err != nil {
		t.Fatalf("CommonEdits: %v", err)
	}
	record := realEditsRecord{DriverRoot: root, NVMLLibrary: libPath, Common: common}
	logEditCounts(t, "common edits", common)
	checkEditsExist(t, "common edits", roots, common)
	if !slices.ContainsFunc(common.Mounts, func(m *cdispec.Mount) bool {
		return strings.HasPrefix(filepath.Base(m.HostPath), "libnvidia-ml.so") ||
			strings.HasPrefix(filepath.Base(m.ContainerPath), "libnvidia-ml.so")
	}) {
		t.Errorf("common edits mount no libnvidia-ml.so; mounts: %v", mountPaths(common))
	}
	if !slices.Contains(nodePaths(common), "/dev/nvidiactl") {
		t.Errorf("common edits lack /dev/nvidiactl; device nodes: %v", nodePaths(common))
	}

	var claim Claim
	claim.UID = realClaimUID
	for _, g := range gpus {
		d := Device{Name: g.Name(), UUID: g.UUID, Minor: g.Minor}
		claim.Devices = append(claim.Devices, d)
		edits, err := src.DeviceEdits(ctx, d)
		if err != nil {
			t.Errorf("DeviceEdits(%s, %s): %v", d.Name, d.UUID, err)
			continue
		}
		owner := fmt.Sprintf("%s (%s)", d.Name, d.UUID)
		record.Devices = append(record.Devices, realDeviceEditsRecord{Name: d.Name, UUID: d.UUID, Minor: d.Minor, Edits: edits})
		logEditCounts(t, owner, edits)
		checkEditsExist(t, owner, roots, edits)
		// NVML's minor number is N in /dev/nvidiaN; a spec that hands the
		// container another GPU's node would be the worst kind of wrong.
		want := fmt.Sprintf("/dev/nvidia%d", d.Minor)
		if !slices.Contains(nodePaths(edits), want) {
			t.Errorf("%s: device edits lack %s; device nodes: %v", owner, want, nodePaths(edits))
		}
	}
	realWriteJSON(t, filepath.Join(out, "edits.json"), record)

	// The writer validates the spec through the CDI library before writing
	// it; resolving it through a fresh cache is what the runtime does next.
	cdiRoot := filepath.Join(t.TempDir(), "cdi")
	ids, err := mustWriter(t, Options{Root: cdiRoot, Source: src, Roots: roots}).WriteClaimSpec(ctx, claim)
	if err != nil {
		t.Fatalf("WriteClaimSpec: %v", err)
	}
	t.Logf("wrote a claim spec for %d GPUs: %v", len(ids), ids)
	specPath := filepath.Join(cdiRoot, SpecFileName(claim.UID))
	data, err := os.ReadFile(specPath)
	if err != nil {
		t.Fatalf("reading the written spec: %v", err)
	}
	if err := os.WriteFile(filepath.Join(out, "spec.json"), data, 0o644); err != nil {
		t.Fatalf("recording the spec: %v", err)
	}
	t.Logf("wrote %s (%d bytes)", filepath.Join(out, "spec.json"), len(data))
	var spec cdispec.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		t.Fatalf("the written spec is not JSON: %v", err)
	}
	t.Logf("spec version %s, kind %s, %d devices", spec.Version, spec.Kind, len(spec.Devices))
	logEditCounts(t, "spec-wide edits", &spec.ContainerEdits)

	injected := inject(t, cdiRoot, ids...)
	got := devicePaths(injected)
	t.Logf("a container of the claim gets device nodes %v and %d mounts", got, len(injected.Mounts))
	want := []string{"/dev/nvidiactl"}
	for _, d := range claim.Devices {
		want = append(want, fmt.Sprintf("/dev/nvidia%d", d.Minor))
	}
	for _, p := range want {
		if !slices.Contains(got, p) {
			t.Errorf("a container of the claim lacks %s; it gets %v", p, got)
		}
	}
}

// checkEditsExist holds edits to the host: device nodes must be character
// devices and mounted files must exist, looked up where this process sees
// the host path.
func checkEditsExist(t *testing.T, owner string, roots Roots, edits *cdispec.ContainerEdits) {
	t.Helper()
	for _, n := range edits.DeviceNodes {
		p := n.HostPath
		if p == "" {
			p = n.Path
		}
		fi, err := os.Stat(roots.ContainerPath(p))
		switch {
		case err != nil:
			t.Errorf("%s: device node %s: %v", owner, p, err)
		case fi.Mode()&fs.ModeCharDevice == 0:
			t.Errorf("%s: device node %s is %v, not a character device", owner, p, fi.Mode())
		}
	}
	for _, m := range edits.Mounts {
		if _, err := os.Stat(roots.ContainerPath(m.HostPath)); err != nil {
			t.Errorf("%s: mount %s -> %s: %v", owner, m.HostPath, m.ContainerPath, err)
		}
	}
}

func logEditCounts(t *testing.T, owner string, edits *cdispec.ContainerEdits) {
	t.Helper()
	t.Logf("%s: %d device nodes %v, %d mounts, %d hooks, %d env %v",
		owner, len(edits.DeviceNodes), nodePaths(edits), len(edits.Mounts), len(edits.Hooks), len(edits.Env), edits.Env)
	for _, h := range edits.Hooks {
		t.Logf("%s: hook %s %s %v", owner, h.HookName, h.Path, h.Args)
	}
}

func nodePaths(edits *cdispec.ContainerEdits) []string {
	var out []string
	for _, n := range edits.DeviceNodes {
		out = append(out, n.Path)
	}
	return out
}

func mountPaths(edits *cdispec.ContainerEdits) []string {
	var out []string
	for _, m := range edits.Mounts {
		out = append(out, m.HostPath)
	}
	return out
}

// realNVMLLibrary is the NVML that nvcdi loads: $PRISM_NVML_LIBRARY when
// set, else empty, which lets nvcdi load libnvidia-ml.so.1 through the
// loader, as the plugin does.
func realNVMLLibrary(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PRISM_NVML_LIBRARY")
	if p == "" {
		t.Log("NVML for nvcdi: libnvidia-ml.so.1 through the loader")
		return ""
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("PRISM_NVML_LIBRARY: %v", err)
	}
	t.Logf("NVML for nvcdi: %s (PRISM_NVML_LIBRARY)", p)
	return p
}

// realCDIOutDir is $PRISM_GPU_OUT/cdi, or a directory discarded after the
// test.
func realCDIOutDir(t *testing.T) string {
	t.Helper()
	base := os.Getenv("PRISM_GPU_OUT")
	if base == "" {
		base = t.TempDir()
		t.Logf("PRISM_GPU_OUT is not set; records go to %s and are discarded", base)
	}
	dir := filepath.Join(base, "cdi")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatalf("creating record directory: %v", err)
	}
	return dir
}

func realWriteJSON(t *testing.T, path string, v any) {
	t.Helper()
	data, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatalf("encoding %s: %v", path, err)
	}
	if err := os.WriteFile(path, append(data, '\n'), 0o644); err != nil {
		t.Fatalf("writing record: %v", err)
	}
	t.Logf("wrote %s", path)
}
