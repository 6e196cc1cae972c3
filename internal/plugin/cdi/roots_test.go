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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/klog/v2/ktesting"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// mountedHostRoot is a fake host "/" as the chart mounts it into the
// plugin container: the plugin sees it at a temporary directory, while
// specs must name the files as the host does, from "/".
func mountedHostRoot(t *testing.T) (containerRoot string, roots Roots) {
	t.Helper()
	containerRoot = fakeRoot(t)
	return containerRoot, Roots{DriverRoot: "/", ContainerDriverRoot: containerRoot}
}

func hostPathsOf(edits cdispec.ContainerEdits) []string {
	var out []string
	for _, n := range edits.DeviceNodes {
		out = append(out, n.HostPath)
	}
	for _, m := range edits.Mounts {
		out = append(out, m.HostPath)
	}
	return out
}

// TestSpecsNameHostPaths: a driver root the plugin sees at another path
// than the host yields specs with the host's paths, while the device node
// check looks where the plugin sees them.
func TestSpecsNameHostPaths(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	containerRoot, roots := mountedHostRoot(t)
	w := mustWriter(t, Options{Root: filepath.Join(t.TempDir(), "cdi"), Source: NewSimulatedSource(roots), Roots: roots})
	if _, err := w.WriteClaimSpec(ctx, Claim{UID: uidA, Devices: []Device{gpu("gpu-0", 0)}}); err != nil {
		t.Fatalf("device nodes present under the container's view of the host were not found: %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(w.root, SpecFileName(uidA)))
	if err != nil {
		t.Fatal(err)
	}
	var spec cdispec.Spec
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	paths := hostPathsOf(spec.ContainerEdits)
	for _, d := range spec.Devices {
		paths = append(paths, hostPathsOf(d.ContainerEdits)...)
	}
	want := []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/usr/lib/x86_64-linux-gnu/libcuda.so." + FakeDriverVersion, "/dev/nvidia0"}
	for _, p := range want {
		if !slices.Contains(paths, p) {
			t.Errorf("spec lacks host path %s; it names %v", p, paths)
		}
	}
	for _, p := range paths {
		if strings.HasPrefix(p, containerRoot) {
			t.Errorf("spec names the container path %s", p)
		}
	}

	// A GPU whose node is missing where the plugin sees the host is refused,
	// although the spec would name a path that may exist in the test's own
	// root file system.
	if err := os.Remove(filepath.Join(containerRoot, "dev", "nvidia0")); err != nil {
		t.Fatal(err)
	}
	if _, err := w.WriteClaimSpec(ctx, Claim{UID: uidB, Devices: []Device{gpu("gpu-0", 0)}}); err == nil {
		t.Error("a spec was written for a device node missing in the container's view")
	}
}

func TestRootsMapping(t *testing.T) {
	driverContainer := t.TempDir() // a driver container's root with its own /dev
	if err := MakeFakeDriverRoot(driverContainer, []int{0}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		roots           Roots
		host, container string
	}{
		{"host driver seen at /driver-root", Roots{DriverRoot: "/", ContainerDriverRoot: "/driver-root"}, "/usr/lib/libcuda.so.1", "/driver-root/usr/lib/libcuda.so.1"},
		{"host /dev seen at /driver-root", Roots{DriverRoot: "/", ContainerDriverRoot: "/driver-root"}, "/dev/nvidia0", "/driver-root/dev/nvidia0"},
		{"plugin in the host's namespace", Roots{}, "/dev/nvidia0", "/dev/nvidia0"},
		{"driver container with its own /dev", Roots{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: driverContainer}, "/run/nvidia/driver/dev/nvidia0", filepath.Join(driverContainer, "dev/nvidia0")},
		{"driver container, nodes on the host's /dev", Roots{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/nonexistent"}, "/dev/nvidia0", "/dev/nvidia0"},
		{"explicit dev root", Roots{DriverRoot: "/", ContainerDriverRoot: "/driver-root", DevRoot: "/", ContainerDevRoot: "/host-dev-root"}, "/dev/nvidia0", "/host-dev-root/dev/nvidia0"},
		{"path outside both roots", Roots{DriverRoot: "/run/nvidia/driver", ContainerDriverRoot: "/driver"}, "/var/lib/prism/bin/nvidia-cdi-hook", "/var/lib/prism/bin/nvidia-cdi-hook"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.roots.ContainerPath(tc.host); got != tc.container {
				t.Errorf("ContainerPath(%s) = %s, want %s", tc.host, got, tc.container)
			}
			if got := tc.roots.HostPath(tc.container); got != tc.host {
				t.Errorf("HostPath(%s) = %s, want %s", tc.container, got, tc.host)
			}
		})
	}
}

// TestNVMLSourceNamesHostPaths runs NVIDIA's generator over a driver root
// seen at another path than the host's and checks that the libraries it
// finds are named by host path, and that the hook is the one asked for.
func TestNVMLSourceNamesHostPaths(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("node has an NVIDIA driver")
	}
	_, ctx := ktesting.NewTestContext(t)
	containerRoot, roots := mountedHostRoot(t)
	src, err := NewNVMLSource(ctx, NVMLOptions{Roots: roots, NVMLLibraryPath: "/nonexistent/libnvidia-ml.so.1"})
	if err != nil {
		t.Fatal(err)
	}
	common, err := src.CommonEdits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paths := hostPathsOf(*common)
	if !slices.Contains(paths, "/usr/lib/x86_64-linux-gnu/libcuda.so."+FakeDriverVersion) {
		t.Errorf("libcuda not named by its host path: %v", paths)
	}
	for _, p := range paths {
		if strings.HasPrefix(p, containerRoot) {
			t.Errorf("common edits name the container path %s", p)
		}
	}
	for _, h := range common.Hooks {
		if h.Path != DefaultNVIDIACDIHookPath {
			t.Errorf("hook %v runs %s, want %s", h.Args, h.Path, DefaultNVIDIACDIHookPath)
		}
	}
}
