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

package explain

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// A GPU in MIG mode is published as its whole self and its partitions, all
// consuming one shared counter set (pkg/gpu). Which devices exclude which
// is read from those counters, as the scheduler reads it, never from
// device names: a device is blocked when the held devices leave less of a
// counter it consumes than it needs.

// counterKey is one shared counter of a pool.
type counterKey struct {
	driver, pool, set, name string
}

// counterSetKey is one counter set of a pool.
type counterSetKey struct {
	driver, pool, set string
}

func (k counterKey) setKey() counterSetKey {
	return counterSetKey{driver: k.driver, pool: k.pool, set: k.set}
}

// counterUse is what the devices of the current slices consume of their
// pools' shared counters, and how much of each counter there is.
type counterUse struct {
	total    map[counterKey]resource.Quantity
	consumes map[DeviceID]map[counterKey]resource.Quantity
	// profile is the migProfile attribute of each partition.
	profile map[DeviceID]string
}

func newCounterUse(current []resourceapi.ResourceSlice) counterUse {
	u := counterUse{
		total:    make(map[counterKey]resource.Quantity),
		consumes: make(map[DeviceID]map[counterKey]resource.Quantity),
		profile:  make(map[DeviceID]string),
	}
	for _, s := range current {
		for _, set := range s.Spec.SharedCounters {
			for name, c := range set.Counters {
				u.total[counterKey{s.Spec.Driver, s.Spec.Pool.Name, set.Name, name}] = c.Value
			}
		}
		for _, d := range s.Spec.Devices {
			id := DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
			if p := stringAttribute(d, s.Spec.Driver, gpuv1alpha1.MIGProfileAttribute); p != "" {
				u.profile[id] = p
			}
			for _, cc := range d.ConsumesCounters {
				for name, c := range cc.Counters {
					if c.Value.Sign() <= 0 {
						continue
					}
					if u.consumes[id] == nil {
						u.consumes[id] = make(map[counterKey]resource.Quantity)
					}
					u.consumes[id][counterKey{s.Spec.Driver, s.Spec.Pool.Name, cc.CounterSet, name}] = c.Value
				}
			}
		}
	}
	return u
}

// sets are the counter sets device id consumes from.
func (u counterUse) sets(id DeviceID) []counterSetKey {
	seen := make(map[counterSetKey]bool)
	for k := range u.consumes[id] {
		seen[k.setKey()] = true
	}
	return slices.SortedFunc(maps.Keys(seen), func(a, b counterSetKey) int {
		return cmp.Or(cmp.Compare(a.driver, b.driver), cmp.Compare(a.pool, b.pool), cmp.Compare(a.set, b.set))
	})
}

// memorySlices are the memory slices device id occupies, in order.
func (u counterUse) memorySlices(id DeviceID) []int {
	var out []int
	for k := range u.consumes[id] {
		if n, ok := memorySlice(k.name); ok {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// label names a device by what it is on its GPU: "3g.20gb@0" for a
// partition at memory slice 0, "whole GPU" for a device without a profile.
func (u counterUse) label(id DeviceID) string {
	p, ok := u.profile[id]
	if !ok {
		return "whole GPU"
	}
	if s := u.memorySlices(id); len(s) > 0 {
		return fmt.Sprintf("%s@%d", p, s[0])
	}
	return p
}

// blocker is a held device that leaves too little of some counters for
// another device.
type blocker struct {
	device   DeviceID
	holders  []Holder
	counters []string
}

// blockers returns the devices of held (the holders of each device that
// count) that block device id, sorted by device. A device never blocks
// itself; one that consumes no counters is never blocked.
func (u counterUse) blockers(id DeviceID, held map[DeviceID][]Holder) []blocker {
	need := u.consumes[id]
	if len(need) == 0 {
		return nil
	}
	byDevice := make(map[DeviceID][]string)
	for k, n := range need {
		total, ok := u.total[k]
		if !ok {
			continue
		}
		used := n.DeepCopy()
		var users []DeviceID
		for h, hs := range held {
			if h == id || len(hs) == 0 {
				continue
			}
			if q, ok := u.consumes[h][k]; ok {
				used.Add(q)
				users = append(users, h)
			}
		}
		if used.Cmp(total) <= 0 {
			continue
		}
		for _, h := range users {
			byDevice[h] = append(byDevice[h], k.name)
		}
	}
	out := make([]blocker, 0, len(byDevice))
	for d, names := range byDevice {
		slices.Sort(names)
		out = append(out, blocker{device: d, holders: held[d], counters: names})
	}
	slices.SortFunc(out, func(a, b blocker) int { return cmp.Compare(a.device.Device, b.device.Device) })
	return out
}

// describe says why bs block a device: "memory slices 0-3 held by
// ml/job-a's 3g.20gb", or "too few multiprocessors left beside ml/job-b's
// 3g.20gb". Memory slices are what binds on every GPU NVIDIA
// ships, so when they conflict the other counters are left unsaid.
func (u counterUse) describe(bs []blocker) string {
	parts := make([]string, len(bs))
	for i, b := range bs {
		var memory []int
		for _, name := range b.counters {
			if n, ok := memorySlice(name); ok {
				memory = append(memory, n)
			}
		}
		claims := make([]string, len(b.holders))
		for j, h := range b.holders {
			claims[j] = h.Claim()
		}
		owner := u.profile[b.device]
		if owner == "" {
			owner = "whole GPU"
		}
		by := strings.Join(claims, " and ") + "'s " + owner
		if len(memory) > 0 {
			parts[i] = memorySlicesText(memory) + " held by " + by
		} else {
			// No slice overlaps: the engines or SMs run out together.
			parts[i] = "too few " + strings.Join(b.counters, ", ") + " left beside " + by
		}
	}
	return strings.Join(parts, "; ")
}

func memorySlice(counter string) (int, bool) {
	rest, ok := strings.CutPrefix(counter, gpuv1alpha1.MemorySliceCounterPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(rest)
	return n, err == nil
}

// memorySlicesText is "memory slice 6" or "memory slices 0-3,6": sorted
// slices with runs joined.
func memorySlicesText(s []int) string {
	s = slices.Compact(slices.Sorted(slices.Values(s)))
	var runs []string
	for i := 0; i < len(s); {
		j := i
		for j+1 < len(s) && s[j+1] == s[j]+1 {
			j++
		}
		if i == j {
			runs = append(runs, strconv.Itoa(s[i]))
		} else {
			runs = append(runs, fmt.Sprintf("%d-%d", s[i], s[j]))
		}
		i = j + 1
	}
	if len(s) == 1 {
		return "memory slice " + runs[0]
	}
	return "memory slices " + strings.Join(runs, ",")
}
