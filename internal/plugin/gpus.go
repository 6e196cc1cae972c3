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
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
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

// TaintKey marks a GPU that NVML reported unhealthy.
const TaintKey = gpuv1alpha1.DriverName + "/unhealthy"

// lostValue is the taint value of a GPU that is gone: fallen off the bus
// (Xid 79) or no longer readable through NVML. Pods on it cannot make
// progress, so it is NoExecute, and it is lifted only when NVML reads the
// GPU again, never by a quiet period: a dead GPU raises no further events.
const lostValue = "gpu-lost"

// unhealthy is the current taint of a GPU or of one MIG partition of it,
// kept under the partition's device name ("gpu-0-mig-1g5gb-3"), which
// names the GPU and the partition: a partition is published with its own
// taint unless its GPU has one, which covers every part of it.
type unhealthy struct {
	// uuid is the GPU the taint is about (a partition's parent), so that it
	// is not carried over to another GPU that later gets the same device
	// name. Empty for a GPU known only from the claims prepared on it.
	uuid      string
	taint     resourceapi.DeviceTaint
	lastEvent time.Time
	// xid is the Xid that set the taint, when this run saw one: 0 for a
	// GPU that NVML cannot read and for taints taken up from before a
	// restart. It names the cause to the kubelet (healthMessage).
	xid uint64
	// remembered is set while NVML cannot read the GPU and has not read it
	// since the plugin started: it is published from this record (see
	// rememberedDevice) rather than from a reading. index is its NVML
	// index.
	remembered bool
	index      int
}

func newTaint(value string, effect resourceapi.DeviceTaintEffect, now time.Time) resourceapi.DeviceTaint {
	return resourceapi.DeviceTaint{Key: TaintKey, Value: value, Effect: effect, TimeAdded: &metav1.Time{Time: now.Truncate(time.Second)}}
}

// healthChange is a taint added or removed, to be logged, announced and
// persisted, or an unreadable GPU left unpublished, to be logged and
// announced.
type healthChange struct {
	device, uuid string
	tainted      bool
	unpublished  bool
	reason       string
}

// nodeRef is the object events about the plugin's own state are attached to.
func nodeRef(name string) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: name, APIVersion: "v1"}
}
