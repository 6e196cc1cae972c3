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
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

const (
	// FakeDriverVersion is the version of the libraries MakeFakeDriverRoot
	// creates.
	FakeDriverVersion = "580.82.07"

	libDir = "usr/lib/x86_64-linux-gnu"

	// Numbers used when a simulated node is a plain file. 195 is the
	// NVIDIA driver's fixed character major; nvidia-uvm gets a dynamic one
	// on real nodes, so any free number will do.
	nvidiaMajor        = 195
	nvidiactlMinor     = 255
	simulatedUVMMajor  = 511
	uvmMinor           = 0
	uvmToolsMinor      = 1
	containerDevPrefix = "/dev"
)

var fakeLibraries = []string{"libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"}

// MakeFakeDriverRoot lays out a driver root with the device nodes of the
// given GPU minors and a few versioned driver libraries. Device nodes are
// empty regular files, so no privileges are needed.
func MakeFakeDriverRoot(dir string, minors []int) error {
	for _, d := range []string{"dev", libDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return fmt.Errorf("creating fake driver root: %w", err)
		}
	}
	files := []string{"dev/nvidiactl", "dev/nvidia-uvm", "dev/nvidia-uvm-tools"}
	for _, m := range minors {
		if m < 0 {
			return fmt.Errorf("creating fake driver root: invalid minor %d", m)
		}
		files = append(files, fmt.Sprintf("dev/nvidia%d", m))
	}
	for _, l := range fakeLibraries {
		files = append(files, filepath.Join(libDir, l+"."+FakeDriverVersion))
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o644); err != nil {
			return fmt.Errorf("creating fake driver root: %w", err)
		}
	}
	return nil
}

// simulatedSource derives edits from a driver root laid out like
// MakeFakeDriverRoot's, or from a real one without using NVML.
type simulatedSource struct {
	roots Roots

	mu     sync.Mutex
	common *cdispec.ContainerEdits
}

// NewSimulatedSource returns an EditSource for a node without GPUs whose
// driver root was made with MakeFakeDriverRoot. It reads the root where this
// process sees it and names the files by their host paths, as the NVML
// source does.
func NewSimulatedSource(roots Roots) EditSource {
	return &simulatedSource{roots: roots.resolve()}
}

// CommonEdits reads the driver root once, on the first call that finds it
// complete, as the NVML source reads the driver once at start: a prepare on
// a simulated node then does the file-system work a real node's does
// (about 60 µs less per prepare here than globbing the libraries again).
func (s *simulatedSource) CommonEdits(_ context.Context) (*cdispec.ContainerEdits, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.common != nil {
		return s.common, nil
	}
	edits, err := s.readCommonEdits()
	if err != nil {
		return nil, err
	}
	s.common = edits
	return edits, nil
}

func (s *simulatedSource) readCommonEdits() (*cdispec.ContainerEdits, error) {
	edits := &cdispec.ContainerEdits{}
	for _, n := range []struct {
		name         string
		major, minor int64
	}{
		{"nvidiactl", nvidiaMajor, nvidiactlMinor},
		{"nvidia-uvm", simulatedUVMMajor, uvmMinor},
		{"nvidia-uvm-tools", simulatedUVMMajor, uvmToolsMinor},
	} {
		node, err := s.deviceNode(n.name, n.major, n.minor)
		if err != nil {
			return nil, err
		}
		edits.DeviceNodes = append(edits.DeviceNodes, node)
	}

	var libs []string
	for _, l := range fakeLibraries {
		m, err := filepath.Glob(filepath.Join(s.roots.ContainerDriverRoot, libDir, l+".*"))
		if err != nil {
			return nil, fmt.Errorf("looking for %s: %w", l, err)
		}
		libs = append(libs, m...)
	}
	if !slices.ContainsFunc(libs, func(p string) bool { return strings.HasPrefix(filepath.Base(p), "libcuda.so.") }) {
		return nil, fmt.Errorf("no libcuda.so.* in %s", filepath.Join(s.roots.ContainerDriverRoot, libDir))
	}
	slices.Sort(libs)
	for _, l := range libs {
		edits.Mounts = append(edits.Mounts, &cdispec.Mount{
			HostPath:      s.roots.HostPath(l),
			ContainerPath: "/" + filepath.Join(libDir, filepath.Base(l)),
			Options:       []string{"ro", "nosuid", "nodev", "bind"},
		})
	}
	return edits, nil
}

func (s *simulatedSource) DeviceEdits(_ context.Context, d Device) (*cdispec.ContainerEdits, error) {
	if d.Minor < 0 {
		return nil, fmt.Errorf("invalid minor %d", d.Minor)
	}
	node, err := s.deviceNode(fmt.Sprintf("nvidia%d", d.Minor), nvidiaMajor, int64(d.Minor))
	if err != nil {
		return nil, err
	}
	edits := &cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{node}}
	if d.MIG != nil {
		caps, err := s.migEdits(d)
		if err != nil {
			return nil, err
		}
		edits.DeviceNodes = append(edits.DeviceNodes, caps.DeviceNodes...)
	}
	return edits, nil
}

// deviceNode describes a node fully, so that the runtime does not need to
// stat a host path which in a simulation is not a device. A real device
// node's own numbers take precedence over the nominal ones.
func (s *simulatedSource) deviceNode(name string, major, minor int64) (*cdispec.DeviceNode, error) {
	seen := filepath.Join(s.roots.ContainerDevRoot, "dev", name)
	var st unix.Stat_t
	if err := unix.Stat(seen, &st); err != nil {
		return nil, fmt.Errorf("device node %s: %w", seen, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR {
		major, minor = int64(unix.Major(st.Rdev)), int64(unix.Minor(st.Rdev))
	}
	return &cdispec.DeviceNode{
		Path:     containerDevPrefix + "/" + name,
		HostPath: s.roots.HostPath(seen),
		Type:     "c",
		Major:    major,
		Minor:    minor,
	}, nil
}
