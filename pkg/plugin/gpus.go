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

package plugin

import (
	"io/fs"
	"strings"
	"sync"

	"github.com/prismgpu/prism/pkg/gpu"
)

// nodeGPUs are the node's GPUs as last discovered and their health: what
// every part of the plugin reads, and what rediscovery and the health
// watch change, under one lock, so that a GPU and its taint are read
// together.
type nodeGPUs struct {
	mu sync.RWMutex
	// byName are the GPUs by device name.
	byName map[string]gpu.Device
	sysfs  fs.ReadLinkFS
	// unhealthy are the taints of GPUs and partitions, by device name.
	unhealthy map[string]unhealthy
	// unwatched is why NVML's Xid events cannot be watched; nil while they
	// are, or before the watch starts.
	unwatched error
	// unpublished are the indexes of GPUs that NVML cannot read and that
	// nothing is known of, so they are not published (see unreadable.go);
	// each is reported once while it stays so.
	unpublished map[int]bool
}

func (g *nodeGPUs) get(name string) (gpu.Device, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	dev, ok := g.byName[name]
	return dev, ok
}

// withUUID finds a GPU by its UUID.
func (g *nodeGPUs) withUUID(uuid string) (gpu.Device, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, dev := range g.byName {
		if dev.UUID == uuid {
			return dev, true
		}
	}
	return gpu.Device{}, false
}

// partition finds a MIG partition of the GPUs by device name, as
// gpu.Partition.Name spells it.
func (g *nodeGPUs) partition(name string) (gpu.Partition, bool) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	for _, dev := range g.byName {
		if dev.MIG == nil || !strings.HasPrefix(name, dev.Name()+"-mig-") {
			continue
		}
		for _, p := range dev.Partitions() {
			if p.Name() == name {
				return p, true
			}
		}
	}
	return gpu.Partition{}, false
}

// inMIGMode lists the GPUs in MIG mode, by index.
func (g *nodeGPUs) inMIGMode() []gpu.Device {
	g.mu.RLock()
	var out []gpu.Device
	for _, dev := range g.byName {
		if dev.MIG != nil {
			out = append(out, dev)
		}
	}
	g.mu.RUnlock()
	gpu.SortByIndex(out)
	return out
}
