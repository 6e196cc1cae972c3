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
	"context"
	"fmt"
	"io/fs"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/prismgpu/prism/pkg/gpu"
)

// Inventory reads a node's GPUs afresh on every call, so that a caller
// polling it sees GPUs that appear or disappear. Like Discover, it returns
// the GPUs it could read alongside an *UnreadableError.
type Inventory interface {
	Read(ctx context.Context) ([]gpu.Device, fs.ReadLinkFS, error)
}

// NewNVMLInventory discovers through an NVML library; sysfs is where PCIe
// roots are looked up (nil omits them).
func NewNVMLInventory(lib nvml.Interface, sysfs fs.ReadLinkFS) Inventory {
	return nvmlInventory{lib: lib, sysfs: sysfs}
}

type nvmlInventory struct {
	lib   nvml.Interface
	sysfs fs.ReadLinkFS
}

func (i nvmlInventory) Read(ctx context.Context) ([]gpu.Device, fs.ReadLinkFS, error) {
	devices, err := Discover(ctx, i.lib, Options{})
	return devices, i.sysfs, err
}

// NewFleetInventory simulates the node described by a fleet file, reading the
// file on every call so that editing it changes the node's GPUs.
func NewFleetInventory(path, nodeName string) Inventory {
	return fleetInventory{path: path, nodeName: nodeName}
}

type fleetInventory struct{ path, nodeName string }

func (i fleetInventory) Read(ctx context.Context) ([]gpu.Device, fs.ReadLinkFS, error) {
	fleet, err := LoadFleet(i.path)
	if err != nil {
		return nil, nil, err
	}
	sim, err := NewSimulated(fleet, i.nodeName)
	if err != nil {
		return nil, nil, fmt.Errorf("simulate fleet %s: %w", i.path, err)
	}
	devices, err := Discover(ctx, sim, Options{})
	return devices, sim.SysFS(), err
}
