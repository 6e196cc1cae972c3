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

package fleet

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/sets"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// published is the fleet as the slices publish it. It is kept per node
// and per pool, so that a slice's event recomputes only the nodes and
// pools it touches and moves the fleet's totals by the difference, however
// large the fleet.
type published struct {
	slices map[string]*Slice            // by name
	pools  map[string]map[string]*Slice // by pool, then name
	nodes  map[string]*node
	// models and partitions are the sums of the nodes' contributions.
	models     map[string]*modelTotals
	partitions map[partitionKey]*partitionTotals
	// deviceModel maps the GPUs of current pool generations to their
	// model.
	deviceModel map[deviceKey]string
	// partitionParent maps the MIG partitions of current pool generations
	// to the GPU they are cut from.
	partitionParent map[deviceKey]deviceKey
}

type deviceKey struct{ pool, device string }

type partitionKey struct{ model, profile string }

func newPublished() published {
	return published{slices: map[string]*Slice{}, pools: map[string]map[string]*Slice{}, nodes: map[string]*node{}, models: map[string]*modelTotals{},
		partitions: map[partitionKey]*partitionTotals{}, deviceModel: map[deviceKey]string{}, partitionParent: map[deviceKey]deviceKey{}}
}

// node is one node's slices and what its current ones add to the fleet:
// their models merged, all mixed where the node publishes more than one,
// sorted by name; and their partitions.
type node struct {
	slices     map[string]*Slice
	models     []rewrite.Model
	partitions []rewrite.PartitionModel
}

func (n *node) modelNames() []string {
	names := make([]string, len(n.models))
	for i, m := range n.models {
		names[i] = m.Name
	}
	return names
}

// setSlice records the slice of that name, or forgets it (s nil). Only
// the newest generation of each pool counts: the plugin replaces a pool's
// slices by publishing a higher generation, and the old ones linger until
// they are deleted. So a slice's event may change which of its pool's
// other slices count, and with them what their nodes contribute.
func (v *View) setSlice(name string, s *Slice) {
	if s != nil && !s.prism {
		s = nil
	}
	old := v.slices[name]
	if old == nil && s == nil {
		return
	}
	pools, nodes := sets.New[string](), sets.New[string]()
	for _, x := range []*Slice{old, s} {
		if x != nil {
			pools.Insert(x.pool)
			nodes.Insert(x.node)
		}
	}
	for p := range pools {
		for _, x := range v.pools[p] {
			nodes.Insert(x.node)
		}
	}
	for p := range pools {
		v.unindexPool(p)
	}
	for n := range nodes {
		v.retractNode(n)
	}
	if old != nil {
		delete(v.slices, name)
		deleteFrom(v.pools, old.pool, name)
		if n := v.nodes[old.node]; n != nil {
			if delete(n.slices, name); len(n.slices) == 0 {
				delete(v.nodes, old.node)
			}
		}
	}
	if s != nil {
		v.slices[name] = s
		if v.pools[s.pool] == nil {
			v.pools[s.pool] = map[string]*Slice{}
		}
		v.pools[s.pool][name] = s
		if v.nodes[s.node] == nil {
			v.nodes[s.node] = &node{slices: map[string]*Slice{}}
		}
		v.nodes[s.node].slices[name] = s
	}
	for p := range pools {
		v.indexPool(p)
	}
	for n := range nodes {
		v.addNode(n)
	}
	v.publish()
}

func deleteFrom[K comparable, V any](m map[string]map[K]V, outer string, inner K) {
	if delete(m[outer], inner); len(m[outer]) == 0 {
		delete(m, outer)
	}
}

// current says whether the slice is of its pool's newest generation.
func (v *View) current(s *Slice) bool {
	for _, o := range v.pools[s.pool] {
		if o.generation > s.generation {
			return false
		}
	}
	return true
}

// indexPool maps the devices of the pool's current slices to their models
// and GPUs, and counts the devices claims hold there. A pool may put
// partitions and their GPUs in different slices.
func (v *View) indexPool(pool string) {
	var gpuByUUID map[string]string
	for _, s := range v.pools[pool] {
		if !v.current(s) {
			continue
		}
		for _, d := range s.devices {
			if d.model == "" {
				continue
			}
			v.deviceModel[deviceKey{pool, d.name}] = d.model
			if d.uuid != "" {
				if gpuByUUID == nil {
					gpuByUUID = map[string]string{}
				}
				gpuByUUID[d.uuid] = d.name
			}
		}
	}
	for _, s := range v.pools[pool] {
		if !v.current(s) {
			continue
		}
		for _, d := range s.devices {
			if gpu, ok := gpuByUUID[d.parent]; ok && d.parent != "" {
				v.partitionParent[deviceKey{pool, d.name}] = deviceKey{pool, gpu}
			}
		}
	}
	v.countHeld(pool, 1)
}

// unindexPool undoes indexPool, before the pool's slices change.
func (v *View) unindexPool(pool string) {
	v.countHeld(pool, -1)
	for _, s := range v.pools[pool] {
		if !v.current(s) {
			continue
		}
		for _, d := range s.devices {
			delete(v.deviceModel, deviceKey{pool, d.name})
			delete(v.partitionParent, deviceKey{pool, d.name})
		}
	}
}

// addNode adds what the node's current slices publish to the fleet.
func (v *View) addNode(name string) {
	n := v.nodes[name]
	if n == nil {
		return
	}
	n.models, n.partitions = nil, nil
	for _, s := range n.slices {
		if !v.current(s) {
			continue
		}
		for _, m := range s.models {
			if i := slices.IndexFunc(n.models, func(o rewrite.Model) bool { return o.Name == m.Name }); i >= 0 {
				n.models[i] = merge(n.models[i], m)
			} else {
				n.models = append(n.models, m)
			}
		}
		for _, p := range s.partitions {
			if i := slices.IndexFunc(n.partitions, func(o rewrite.PartitionModel) bool { return o.Model == p.Model && o.Profile == p.Profile }); i >= 0 {
				n.partitions[i] = mergePartition(n.partitions[i], p)
			} else {
				n.partitions = append(n.partitions, p)
			}
		}
	}
	slices.SortFunc(n.models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	for i := range n.models {
		if len(n.models) > 1 {
			n.models[i].MixedDevices = n.models[i].Devices
		}
		v.totalModel(n.models[i].Name).add(n.models[i], 1)
	}
	for _, p := range n.partitions {
		v.totalPartition(partitionKey{p.Model, p.Profile}).add(p, 1)
	}
}

// retractNode takes what addNode added of the node out of the fleet.
func (v *View) retractNode(name string) {
	n := v.nodes[name]
	if n == nil {
		return
	}
	for _, m := range n.models {
		t := v.models[m.Name]
		if t.add(m, -1); t.devices == 0 {
			delete(v.models, m.Name)
		}
	}
	for _, p := range n.partitions {
		k := partitionKey{p.Model, p.Profile}
		t := v.partitions[k]
		if t.add(p, -1); t.devices == 0 {
			delete(v.partitions, k)
		}
	}
	n.models, n.partitions = nil, nil
}

func (v *View) totalModel(name string) *modelTotals {
	t := v.models[name]
	if t == nil {
		t = &modelTotals{bandwidth: figures{}, fp32: figures{}, memory: figures{}, multiprocessors: figures{}}
		v.models[name] = t
	}
	return t
}

func (v *View) totalPartition(k partitionKey) *partitionTotals {
	t := v.partitions[k]
	if t == nil {
		t = &partitionTotals{memory: figures{}, multiprocessors: figures{}}
		v.partitions[k] = t
	}
	return t
}

// publish makes the fleet from the totals: a few models and partitions,
// however many nodes publish them.
func (v *View) publish() {
	f := &rewrite.Fleet{Models: make([]rewrite.Model, 0, len(v.models))}
	for name, t := range v.models {
		f.Models = append(f.Models, t.model(name))
	}
	slices.SortFunc(f.Models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	for k, t := range v.partitions {
		f.Partitions = append(f.Partitions, t.partition(k))
	}
	slices.SortFunc(f.Partitions, func(a, b rewrite.PartitionModel) int {
		return cmp.Or(strings.Compare(a.Model, b.Model), strings.Compare(a.Profile, b.Profile))
	})
	v.fleet.Store(f)
	v.load = nil
	select {
	case v.changed <- struct{}{}:
	default:
	}
}

// modelTotals sums the nodes' contributions of one model. A figure that
// the fleet takes at its smallest (or largest) across nodes cannot be
// taken back out of a minimum, so each is kept as how many nodes publish
// each value.
type modelTotals struct {
	devices, mixed, shared, computeLimits, figureCapacity int
	bandwidth, fp32, memory, multiprocessors              figures
}

func (t *modelTotals) add(m rewrite.Model, sign int) {
	t.devices += sign * m.Devices
	t.mixed += sign * m.MixedDevices
	t.shared += sign * m.SharedDevices
	t.computeLimits += sign * m.ComputeLimitDevices
	t.figureCapacity += sign * m.FigureCapacityDevices
	t.bandwidth.add(m.BandwidthGBps, sign)
	t.fp32.add(m.FP32GFLOPS, sign)
	t.memory.add(m.MemoryBytes, sign)
	t.multiprocessors.add(m.Multiprocessors, sign)
}

// model is the model as merge would make it of every node's devices.
func (t *modelTotals) model(name string) rewrite.Model {
	return rewrite.Model{Name: name, Devices: t.devices, BandwidthGBps: t.bandwidth.least(), FP32GFLOPS: t.fp32.least(), MemoryBytes: t.memory.most(),
		Multiprocessors: t.multiprocessors.least(), MixedDevices: t.mixed, SharedDevices: t.shared, ComputeLimitDevices: t.computeLimits, FigureCapacityDevices: t.figureCapacity}
}

// partitionTotals sums the nodes' contributions of one MIG profile of a
// model.
type partitionTotals struct {
	devices                 int
	memory, multiprocessors figures
}

func (t *partitionTotals) add(p rewrite.PartitionModel, sign int) {
	t.devices += sign * p.Devices
	t.memory.add(p.MemoryBytes, sign)
	t.multiprocessors.add(p.Multiprocessors, sign)
}

// partition is the profile as mergePartition would make it of every node's
// partitions.
func (t *partitionTotals) partition(k partitionKey) rewrite.PartitionModel {
	return rewrite.PartitionModel{Model: k.model, Profile: k.profile, Devices: t.devices, MemoryBytes: t.memory.least(), Multiprocessors: t.multiprocessors.least()}
}

// figures counts the nodes that publish each value of a figure; zero, not
// published, is not counted.
type figures map[int64]int

func (f figures) add(value int64, sign int) {
	if value == 0 {
		return
	}
	if f[value] += sign; f[value] == 0 {
		delete(f, value)
	}
}

// least is the smallest value published, 0 when none is.
func (f figures) least() int64 {
	if len(f) == 0 {
		return 0
	}
	return slices.Min(slices.Collect(maps.Keys(f)))
}

// most is the largest value published, 0 when none is.
func (f figures) most() int64 {
	if len(f) == 0 {
		return 0
	}
	return slices.Max(slices.Collect(maps.Keys(f)))
}

// merge adds b's devices to a. Devices of one model publish the same
// figures unless their clocks differ (a power-capped board, another
// firmware); the model then counts with its slowest devices, so that a
// threshold cut from it admits every one of them.
func merge(a, b rewrite.Model) rewrite.Model {
	if a.Devices == 0 {
		return b
	}
	a.Devices += b.Devices
	a.MixedDevices += b.MixedDevices
	a.SharedDevices += b.SharedDevices
	a.ComputeLimitDevices += b.ComputeLimitDevices
	a.FigureCapacityDevices += b.FigureCapacityDevices
	a.BandwidthGBps = minKnown(a.BandwidthGBps, b.BandwidthGBps)
	a.FP32GFLOPS = minKnown(a.FP32GFLOPS, b.FP32GFLOPS)
	a.MemoryBytes = max(a.MemoryBytes, b.MemoryBytes)
	a.Multiprocessors = minKnown(a.Multiprocessors, b.Multiprocessors)
	return a
}

// mergePartition adds b's devices to a; the profile counts with its
// smallest figures, so that a partition chosen from them holds what it
// was chosen for on every GPU.
func mergePartition(a, b rewrite.PartitionModel) rewrite.PartitionModel {
	if a.Devices == 0 {
		return b
	}
	a.Devices += b.Devices
	a.MemoryBytes = minKnown(a.MemoryBytes, b.MemoryBytes)
	a.Multiprocessors = minKnown(a.Multiprocessors, b.Multiprocessors)
	return a
}

// minKnown is the smaller figure, zero (not published) counting as unknown.
func minKnown(a, b int64) int64 {
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}
