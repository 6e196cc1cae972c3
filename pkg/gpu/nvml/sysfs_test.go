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
	"io/fs"
	"path"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// A simulated node's sysfs is read as a file system by the deviceattribute
// helpers, so it must be one: fstest.TestFS walks it, links included, and
// a GPU's numa_node reads the same through its bus link as in its device
// directory.
func TestSimulatedSysFSIsAFileSystem(t *testing.T) {
	fleet := &Fleet{DriverVersion: "550.54.15", CUDADriverVersion: 12040,
		GPUs: []GPUGroup{{Product: "NVIDIA H100 80GB HBM3", Count: 2, NUMANodes: 2}}}
	sysfs := simulate(t, fleet, "node-a").SysFS()
	if err := fstest.TestFS(sysfs,
		"bus/pci/devices/0000:07:00.0", "bus/pci/devices/0000:0f:00.0",
		"devices/pci0000:00/0000:00:01.0/0000:07:00.0/numa_node",
		"devices/pci0000:00/0000:00:02.0/0000:0f:00.0/numa_node",
	); err != nil {
		t.Fatal(err)
	}

	type gpuDir struct{ Link, NUMAThroughLink, NUMAInDevices string }
	var got []gpuDir
	for _, bdf := range []string{"0000:07:00.0", "0000:0f:00.0"} {
		link := "bus/pci/devices/" + bdf
		target, err := fs.ReadLink(sysfs, link)
		if err != nil {
			t.Fatalf("ReadLink: %v", err)
		}
		through, err := fs.ReadFile(sysfs, link+"/numa_node")
		if err != nil {
			t.Fatalf("ReadFile through the link: %v", err)
		}
		direct, err := fs.ReadFile(sysfs, path.Join("bus/pci/devices", target, "numa_node"))
		if err != nil {
			t.Fatalf("ReadFile in the device directory: %v", err)
		}
		got = append(got, gpuDir{target, string(through), string(direct)})
	}
	want := []gpuDir{
		{"../../../devices/pci0000:00/0000:00:01.0/0000:07:00.0", "0\n", "0\n"},
		{"../../../devices/pci0000:00/0000:00:02.0/0000:0f:00.0", "1\n", "1\n"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("sysfs (-want +got):\n%s", diff)
	}
}

// A link that loops or leaves the tree can be read as a link but leads
// nowhere; a file is not a link.
func TestSysFSLinksThatLeadNowhere(t *testing.T) {
	s := sysFS{}
	s.addLink("loop", "loop")
	s.addLink("up", "../etc")
	s.addLink("absolute", "/etc")
	s.addFile("file", []byte("x"))
	for _, name := range []string{"loop", "up", "absolute"} {
		if _, err := fs.ReadLink(s, name); err != nil {
			t.Errorf("ReadLink(%q): %v", name, err)
		}
		if info, err := s.Lstat(name); err != nil || info.Mode().Type() != fs.ModeSymlink {
			t.Errorf("Lstat(%q) = %v, %v; want a link", name, info, err)
		}
		if _, err := fs.ReadFile(s, name); err == nil {
			t.Errorf("ReadFile(%q) succeeded through a link that leads nowhere", name)
		}
	}
	if _, err := fs.ReadLink(s, "file"); !errors.Is(err, fs.ErrInvalid) {
		t.Errorf("ReadLink(file) = %v, want %v", err, fs.ErrInvalid)
	}
	if _, err := fs.ReadLink(s, "missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadLink(missing) = %v, want %v", err, fs.ErrNotExist)
	}
}
