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
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/klog/v2/ktesting"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/prismgpu/prism/internal/goldentest"
)

const (
	uidA = "0b6c7f35-54a9-4d0f-9a53-6f3f4bb2a1c1"
	uidB = "5e1d2c3b-0000-4000-8000-000000000002"
	uidC = "9f00aa11-2222-4333-8444-555566667777"
)

type fixture struct {
	driverRoot string
	cdiRoot    string
	writer     *Writer
}

func newFixture(t *testing.T, minors ...int) *fixture {
	t.Helper()
	f := &fixture{driverRoot: t.TempDir(), cdiRoot: filepath.Join(t.TempDir(), "cdi")}
	if err := MakeFakeDriverRoot(f.driverRoot, minors); err != nil {
		t.Fatal(err)
	}
	f.writer = mustWriter(t, Options{Root: f.cdiRoot, Source: NewSimulatedSource(Roots{DriverRoot: f.driverRoot})})
	return f
}

func mustWriter(t testing.TB, o Options) *Writer {
	t.Helper()
	w, err := NewWriter(o)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// touch creates an empty file where the writer's checks want one: a
// device node or a library.
func touch(t *testing.T, path string) string {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func gpu(name string, minor int) Device {
	return Device{Name: name, Minor: minor, UUID: "GPU-" + strings.Repeat(string(rune('a'+minor)), 8)}
}

// inject resolves ids the way a container runtime does: through a fresh
// CDI cache over the directory, into an empty OCI spec.
func inject(t *testing.T, dir string, ids ...string) *oci.Spec {
	t.Helper()
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(dir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if errs := cache.GetErrors(); len(errs) > 0 {
		t.Fatalf("CDI cache rejected the specs: %v", errs)
	}
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := cache.InjectDevices(spec, ids...)
	if err != nil {
		t.Fatalf("injecting %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}

func devicePaths(spec *oci.Spec) []string {
	var out []string
	for _, d := range spec.Linux.Devices {
		out = append(out, d.Path)
	}
	slices.Sort(out)
	return out
}

func TestWriteClaimSpec(t *testing.T) {
	timeout := 10
	tests := []struct {
		name        string
		claim       Claim
		inject      []int // indexes of the returned IDs the container uses
		wantIDs     []string
		wantDevices []string
		wantEnv     []string
		wantMounts  []string
	}{
		{
			name:    "one GPU",
			claim:   Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}},
			inject:  []int{0},
			wantIDs: []string{"k8s.gpu.prism.dev/claim=" + uidA + "-gpu-0"},
			wantDevices: []string{
				"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl",
			},
			wantEnv: []string{"NVIDIA_VISIBLE_DEVICES=GPU-aaaaaaaa", "PRISM_CLAIM_UID=" + uidA},
			wantMounts: []string{
				"/usr/lib/x86_64-linux-gnu/libcuda.so." + FakeDriverVersion,
				"/usr/lib/x86_64-linux-gnu/libnvidia-ml.so." + FakeDriverVersion,
			},
		},
		{
			name: "two GPUs with sharing and profiling edits",
			claim: Claim{
				UID: uidB,
				Devices: []Device{
					gpu("gpu-1", 1),
					func() Device {
						d := gpu("gpu-3", 3)
						d.Edits = &cdispec.ContainerEdits{Env: []string{"PRISM_GPU_MEMORY_LIMIT_GPU_3=8Gi"}}
						return d
					}(),
				},
				Edits: &cdispec.ContainerEdits{
					Env:    []string{"PRISM_PROFILING=1"},
					Mounts: []*cdispec.Mount{{HostPath: "/var/lib/prism/reports/" + uidB, ContainerPath: "/prism/reports", Options: []string{"rw", "bind"}}},
					Hooks:  []*cdispec.Hook{{HookName: "createContainer", Path: "/usr/bin/prism-hook", Args: []string{"prism-hook", "profile"}, Timeout: &timeout}},
				},
			},
			inject: []int{0, 1},
			wantIDs: []string{
				"k8s.gpu.prism.dev/claim=" + uidB + "-gpu-1",
				"k8s.gpu.prism.dev/claim=" + uidB + "-gpu-3",
			},
			wantDevices: []string{
				"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl",
			},
			wantEnv: []string{
				"NVIDIA_VISIBLE_DEVICES=GPU-bbbbbbbb,GPU-dddddddd",
				"PRISM_CLAIM_UID=" + uidB,
				"PRISM_PROFILING=1",
				"PRISM_GPU_MEMORY_LIMIT_GPU_3=8Gi",
			},
			wantMounts: []string{"/prism/reports"},
		},
		{
			name: "container uses one of two devices",
			claim: Claim{UID: uidC, Devices: []Device{
				gpu("gpu-0", 0), gpu("gpu-2", 2),
			}},
			inject: []int{1},
			wantIDs: []string{
				"k8s.gpu.prism.dev/claim=" + uidC + "-gpu-0",
				"k8s.gpu.prism.dev/claim=" + uidC + "-gpu-2",
			},
			wantDevices: []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia2", "/dev/nvidiactl"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, 0, 1, 2, 3)
			ids, err := f.writer.WriteClaimSpec(ctx, tc.claim)
			if err != nil {
				t.Fatalf("WriteClaimSpec: %v", err)
			}
			if !slices.Equal(ids, tc.wantIDs) {
				t.Fatalf("IDs = %v, want %v", ids, tc.wantIDs)
			}
			if _, err := os.Stat(filepath.Join(f.cdiRoot, "k8s.gpu.prism.dev-claim_"+tc.claim.UID+".json")); err != nil {
				t.Errorf("spec file not at the expected name: %v", err)
			}

			var use []string
			for _, i := range tc.inject {
				use = append(use, ids[i])
			}
			spec := inject(t, f.cdiRoot, use...)
			if got := devicePaths(spec); !slices.Equal(got, tc.wantDevices) {
				t.Errorf("device nodes = %v, want %v", got, tc.wantDevices)
			}
			for _, d := range spec.Linux.Devices {
				if d.Type != "c" || d.Major == 0 {
					t.Errorf("device %s not fully specified: %+v", d.Path, d)
				}
			}
			for _, e := range tc.wantEnv {
				if !slices.Contains(spec.Process.Env, e) {
					t.Errorf("env %q missing from %v", e, spec.Process.Env)
				}
			}
			var mounts []string
			for _, m := range spec.Mounts {
				mounts = append(mounts, m.Destination)
			}
			for _, m := range tc.wantMounts {
				if !slices.Contains(mounts, m) {
					t.Errorf("mount %s missing from %v", m, mounts)
				}
			}
		})
	}
}

// TestSpecGolden pins the generated spec, including the version that the
// library's minimum-version logic picks.
func TestSpecGolden(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, 0, 1)
	claim := Claim{
		UID:     uidA,
		Devices: []Device{gpu("gpu-0", 0), gpu("gpu-1", 1)},
		Edits:   &cdispec.ContainerEdits{Env: []string{"PRISM_GPU_MEMORY_LIMIT=16Gi"}},
	}
	if _, err := f.writer.WriteClaimSpec(ctx, claim); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(f.cdiRoot, SpecFileName(uidA)))
	if err != nil {
		t.Fatal(err)
	}
	var pretty bytes.Buffer
	if err := json.Indent(&pretty, raw, "", "  "); err != nil {
		t.Fatal(err)
	}
	got := bytes.ReplaceAll(pretty.Bytes(), []byte(f.driverRoot), []byte("$DRIVER_ROOT"))
	got = append(got, '\n')
	goldentest.Compare(t, filepath.Join("testdata", "claim-spec.golden.json"), got)
}

func TestWriteIsIdempotent(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, 0, 1)
	claim := Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0), gpu("gpu-1", 1)}}
	write := func() ([]string, []byte) {
		t.Helper()
		ids, err := f.writer.WriteClaimSpec(ctx, claim)
		if err != nil {
			t.Fatal(err)
		}
		content, err := os.ReadFile(filepath.Join(f.cdiRoot, SpecFileName(uidA)))
		if err != nil {
			t.Fatal(err)
		}
		return ids, content
	}
	ids1, first := write()
	ids2, second := write()
	if !slices.Equal(ids1, ids2) {
		t.Errorf("IDs changed: %v then %v", ids1, ids2)
	}
	if !bytes.Equal(first, second) {
		t.Errorf("content changed:\n%s\n%s", first, second)
	}
	entries, err := os.ReadDir(f.cdiRoot)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("want exactly one file in the CDI root, got %d", len(entries))
	}
}

func TestRemoveAndList(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	f := newFixture(t, 0)
	if uids, err := f.writer.ListClaimSpecs(ctx); err != nil || len(uids) != 0 {
		t.Fatalf("listing a CDI root that does not exist yet: %v, %v", uids, err)
	}
	for _, uid := range []string{uidC, uidA, uidB} {
		if _, err := f.writer.WriteClaimSpec(ctx, Claim{UID: uid, Devices: []Device{gpu("gpu-0", 0)}}); err != nil {
			t.Fatal(err)
		}
	}
	// Things that must not be mistaken for claim specs.
	for name, content := range map[string]string{
		"nvidia.com-gpu.json":                      `{}`,
		"k8s.gpu.prism.dev-claim_not a uid!.json":  `{}`,
		"k8s.gpu.prism.dev-claim_" + uidA + ".bak": `{}`,
		"spec.1234.tmp":                            `{}`,
	} {
		if err := os.WriteFile(filepath.Join(f.cdiRoot, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(f.cdiRoot, "k8s.gpu.prism.dev-claim_"+uidB+"0.json"), 0o755); err != nil {
		t.Fatal(err)
	}

	uids, err := f.writer.ListClaimSpecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{uidA, uidB, uidC}; !slices.Equal(uids, want) {
		t.Fatalf("ListClaimSpecs = %v, want %v", uids, want)
	}

	if err := f.writer.RemoveClaimSpec(ctx, uidB); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(f.cdiRoot, SpecFileName(uidB))); !os.IsNotExist(err) {
		t.Errorf("spec still present after removal: %v", err)
	}
	if err := f.writer.RemoveClaimSpec(ctx, uidB); err != nil {
		t.Errorf("second removal must succeed: %v", err)
	}
	uids, err = f.writer.ListClaimSpecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{uidA, uidC}; !slices.Equal(uids, want) {
		t.Errorf("after removal ListClaimSpecs = %v, want %v", uids, want)
	}
	if err := f.writer.RemoveClaimSpec(ctx, "../nvidia.com-gpu"); err == nil {
		t.Error("removal with a path in the UID succeeded")
	}
	if _, err := os.Stat(filepath.Join(f.cdiRoot, "nvidia.com-gpu.json")); err != nil {
		t.Errorf("unrelated spec was touched: %v", err)
	}
}

func TestWriteRejects(t *testing.T) {
	tests := []struct {
		name    string
		claim   Claim
		prepare func(t *testing.T, f *fixture)
		wantErr string
	}{
		{
			name:    "GPU device node missing",
			claim:   Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0), gpu("gpu-7", 7)}},
			wantErr: "nvidia7",
		},
		{
			name:  "control device node missing",
			claim: Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}},
			prepare: func(t *testing.T, f *fixture) {
				if err := os.Remove(filepath.Join(f.driverRoot, "dev", "nvidia-uvm")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "nvidia-uvm",
		},
		{
			name:  "no driver libraries",
			claim: Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}},
			prepare: func(t *testing.T, f *fixture) {
				if err := os.RemoveAll(filepath.Join(f.driverRoot, "usr")); err != nil {
					t.Fatal(err)
				}
			},
			wantErr: "no libcuda.so",
		},
		{
			name:    "UID with a path",
			claim:   Claim{UID: "../../etc/cdi/x", Devices: []Device{gpu("gpu-0", 0)}},
			wantErr: "invalid claim UID",
		},
		{
			name:    "empty UID",
			claim:   Claim{Devices: []Device{gpu("gpu-0", 0)}},
			wantErr: "invalid claim UID",
		},
		{
			name:    "no devices",
			claim:   Claim{UID: uidA},
			wantErr: "no devices",
		},
		{
			name:    "device listed twice",
			claim:   Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0), gpu("gpu-0", 0)}},
			wantErr: "listed twice",
		},
		{
			name:    "device name not valid in CDI",
			claim:   Claim{UID: uidA, Devices: []Device{{Name: "gpu/0", Minor: 0}}},
			wantErr: "invalid character",
		},
		{
			name: "invalid caller edits",
			claim: Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}, Edits: &cdispec.ContainerEdits{
				Env: []string{"=novalue"},
			}},
			wantErr: "invalid environment variable",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, ctx := ktesting.NewTestContext(t)
			f := newFixture(t, 0, 1)
			if tc.prepare != nil {
				tc.prepare(t, f)
			}
			ids, err := f.writer.WriteClaimSpec(ctx, tc.claim)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("WriteClaimSpec = %v, %v; want error containing %q", ids, err, tc.wantErr)
			}
			if ids != nil {
				t.Errorf("IDs returned with an error: %v", ids)
			}
			entries, _ := os.ReadDir(f.cdiRoot)
			if len(entries) != 0 {
				t.Errorf("files written despite the error: %v", entries)
			}
		})
	}
}

// staticSource returns fixed edits, standing in for nvcdi.
type staticSource struct {
	common, device cdispec.ContainerEdits
}

func (s staticSource) CommonEdits(context.Context) (*cdispec.ContainerEdits, error) {
	return &s.common, nil
}

func (s staticSource) DeviceEdits(context.Context, Device) (*cdispec.ContainerEdits, error) {
	return &s.device, nil
}

func TestWriterChecksNodesOfAnySource(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	present := touch(t, filepath.Join(dir, "nvidia0"))
	src := staticSource{
		common: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidiactl", HostPath: filepath.Join(dir, "nvidiactl"), Type: "c", Major: 195, Minor: 255}}},
		device: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", HostPath: present, Type: "c", Major: 195}}},
	}
	w := mustWriter(t, Options{Root: filepath.Join(dir, "cdi"), Source: src})
	_, err := w.WriteClaimSpec(ctx, Claim{UID: uidA, Devices: []Device{{Name: "gpu-0", UUID: "GPU-1"}}})
	if err == nil || !strings.Contains(err.Error(), "nvidiactl needed by all devices") {
		t.Fatalf("want an error about the missing nvidiactl, got %v", err)
	}
}

func TestEnvPrecedence(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	dir := t.TempDir()
	node := touch(t, filepath.Join(dir, "nvidia0"))
	// nvcdi's common edits hide all GPUs from legacy hooks; the claim's
	// own list must replace that, and the caller has the last word.
	src := staticSource{
		common: cdispec.ContainerEdits{Env: []string{"NVIDIA_VISIBLE_DEVICES=void", "LD_LIBRARY_PATH=/x"}},
		device: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/nvidia0", HostPath: node, Type: "c", Major: 195}}},
	}
	cdiRoot := filepath.Join(dir, "cdi")
	ids, err := mustWriter(t, Options{Root: cdiRoot, Source: src}).WriteClaimSpec(ctx, Claim{
		UID:     uidA,
		Devices: []Device{{Name: "gpu-0", UUID: "GPU-1"}},
		Edits:   &cdispec.ContainerEdits{Env: []string{"LD_LIBRARY_PATH=/y"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := inject(t, cdiRoot, ids...)
	want := []string{"PRISM_CLAIM_UID=" + uidA, "NVIDIA_VISIBLE_DEVICES=GPU-1", "LD_LIBRARY_PATH=/y"}
	if !slices.Equal(spec.Process.Env, want) {
		t.Errorf("env = %v, want %v", spec.Process.Env, want)
	}
	if src.common.Env[0] != "NVIDIA_VISIBLE_DEVICES=void" {
		t.Errorf("source edits were modified: %v", src.common.Env)
	}
}

func TestMakeFakeDriverRoot(t *testing.T) {
	dir := t.TempDir()
	if err := MakeFakeDriverRoot(dir, []int{0, 5}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{
		"dev/nvidia0", "dev/nvidia5", "dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools",
		"usr/lib/x86_64-linux-gnu/libcuda.so." + FakeDriverVersion,
	} {
		if _, err := os.Stat(filepath.Join(dir, p)); err != nil {
			t.Errorf("%s missing: %v", p, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "dev/nvidia1")); !os.IsNotExist(err) {
		t.Errorf("unrequested minor created: %v", err)
	}
	if err := MakeFakeDriverRoot(t.TempDir(), []int{-1}); err == nil {
		t.Error("negative minor accepted")
	}
}

// Without a GPU, nvcdi can still discover the driver files of a driver
// root, but not resolve GPUs, which needs NVML. Both halves are checked;
// resolving a real GPU's edits is left to nodes with one.
func TestNVMLSourceWithoutGPU(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("node has an NVIDIA driver")
	}
	_, ctx := ktesting.NewTestContext(t)

	t.Run("driver root without a driver", func(t *testing.T) {
		empty := t.TempDir()
		src, err := NewNVMLSource(ctx, NVMLOptions{Roots: Roots{DriverRoot: empty}})
		if err == nil {
			t.Fatalf("expected an error, got source %+v", src)
		}
		if !strings.Contains(err.Error(), empty) {
			t.Errorf("error %q does not name the driver root", err)
		}
	})

	t.Run("fake driver root", func(t *testing.T) {
		root := fakeRoot(t)
		src, err := NewNVMLSource(ctx, NVMLOptions{Roots: Roots{DriverRoot: root}, NVMLLibraryPath: "/nonexistent/libnvidia-ml.so.1"})
		if err != nil {
			t.Fatalf("NewNVMLSource: %v", err)
		}
		common, err := src.CommonEdits(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// nvcdi only picks up control nodes that are real character
		// devices, which the fake root's are not; libraries it does find.
		var mounts []string
		for _, m := range common.Mounts {
			mounts = append(mounts, m.ContainerPath)
		}
		if !slices.Contains(mounts, "/usr/lib/x86_64-linux-gnu/libcuda.so."+FakeDriverVersion) {
			t.Errorf("common edits lack libcuda: %v", mounts)
		}

		if _, err := src.DeviceEdits(ctx, Device{Name: "gpu-0"}); err == nil || !strings.Contains(err.Error(), "no UUID") {
			t.Errorf("device without UUID: %v", err)
		}
		w := mustWriter(t, Options{Root: filepath.Join(t.TempDir(), "cdi"), Source: src})
		_, err = w.WriteClaimSpec(ctx, Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}})
		if err == nil || !strings.Contains(err.Error(), "GPU-aaaaaaaa") {
			t.Errorf("resolving a GPU without NVML: want an error naming the GPU, got %v", err)
		}
	})
}

func fakeRoot(t *testing.T) string {
	dir := t.TempDir()
	if err := MakeFakeDriverRoot(dir, []int{0}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSimulatedSourceReadsTheRootOnce: like the NVML source, the simulated
// one reads the driver root's common files once, but only once they are
// all there; a device node that goes away later is still refused by the
// writer's check on every spec.
func TestSimulatedSourceReadsTheRootOnce(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	root := fakeRoot(t)
	libcuda := filepath.Join(root, libDir, "libcuda.so."+FakeDriverVersion)
	if err := os.Remove(libcuda); err != nil {
		t.Fatal(err)
	}
	src := NewSimulatedSource(Roots{DriverRoot: root})
	if _, err := src.CommonEdits(ctx); err == nil || !strings.Contains(err.Error(), "libcuda") {
		t.Fatalf("common edits of a root without libcuda: %v, want an error naming libcuda", err)
	}
	touch(t, libcuda)
	first, err := src.CommonEdits(ctx)
	if err != nil {
		t.Fatalf("common edits once libcuda is there: %v", err)
	}
	if err := os.Remove(libcuda); err != nil {
		t.Fatal(err)
	}
	if again, err := src.CommonEdits(ctx); err != nil || again != first {
		t.Errorf("second read: %v (same edits: %v), want the first read's edits", err, again == first)
	}
	w := mustWriter(t, Options{Root: filepath.Join(t.TempDir(), "cdi"), Source: src})
	if err := os.Remove(filepath.Join(root, "dev", "nvidiactl")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(ctx, Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}}); err == nil || !strings.Contains(err.Error(), "nvidiactl") {
		t.Errorf("spec with a removed control node: %v, want an error naming nvidiactl", err)
	}
}
