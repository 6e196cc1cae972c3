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
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// GPU is one published device with the claims that hold it. A GPU in MIG
// mode is one GPU with its partitions folded into MIG.
type GPU struct {
	Node, Pool, Device string
	Product, Class     string
	// BandwidthGBps and FP32GFLOPS are 0 when not published.
	BandwidthGBps, FP32GFLOPS int64
	// Memory is nil when not published.
	Memory *resource.Quantity
	Taints []resourceapi.DeviceTaint
	HeldBy []Holder
	// MIG is set for a GPU published with its partitions.
	MIG *MIG
}

// MIG is what a GPU in MIG mode has of partitions, read from the counters
// they consume.
type MIG struct {
	// Partitions counts the partitions published, Free those that neither
	// are held nor share a memory slice or engine that a held device
	// (a partition, or the whole GPU) takes.
	Partitions, Free int
	// MemorySlices counts the GPU's memory slices, MemorySlicesHeld those
	// held devices occupy.
	MemorySlices, MemorySlicesHeld int
	// Held are the partitions claims hold, by device name.
	Held []Partition
}

// Partition is a MIG partition claims hold.
type Partition struct {
	Device string
	// Label is the profile at its first memory slice, "3g.20gb@0".
	Label  string
	HeldBy []Holder
}

// Mode is "MIG: 6 of 8 memory slices held, 0 of 25 partitions free".
func (m MIG) Mode() string {
	out := "MIG: "
	if m.MemorySlices > 0 {
		out += fmt.Sprintf("%d of %d memory slices held, ", m.MemorySlicesHeld, m.MemorySlices)
	}
	return out + fmt.Sprintf("%d of %d partitions free", m.Free, m.Partitions)
}

// Fleet lists every device of slices, current pool generations only, with
// its holders (from Holders), sorted by node and device. The partitions
// of a GPU in MIG mode, the devices with a MIG profile that consume the
// counter set its whole-GPU device consumes, are folded into its row.
func Fleet(resourceSlices []resourceapi.ResourceSlice, holders map[DeviceID][]Holder) []GPU {
	current := currentSlices(resourceSlices)
	use := newCounterUse(current)
	// The whole GPU of a counter set is the device without a profile that
	// consumes it; its partitions are the devices with one.
	whole := make(map[counterSetKey]DeviceID)
	partitions := make(map[counterSetKey][]DeviceID)
	for _, s := range current {
		for _, d := range s.Spec.Devices {
			id := DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
			for _, set := range use.sets(id) {
				if _, ok := use.profile[id]; ok {
					partitions[set] = append(partitions[set], id)
				} else {
					whole[set] = id
				}
			}
		}
	}
	folded := func(id DeviceID) bool {
		if _, ok := use.profile[id]; !ok {
			return false
		}
		for _, set := range use.sets(id) {
			if _, ok := whole[set]; ok {
				return true
			}
		}
		return false
	}

	var out []GPU
	for _, s := range current {
		for _, d := range s.Spec.Devices {
			id := DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}
			if folded(id) {
				continue
			}
			g := GPU{
				Node: sliceNode(s), Pool: s.Spec.Pool.Name, Device: d.Name,
				Product:       stringAttribute(d, s.Spec.Driver, gpuv1alpha1.ProductNameAttribute),
				Class:         stringAttribute(d, s.Spec.Driver, gpuv1alpha1.BandwidthClassAttribute),
				BandwidthGBps: intAttribute(d, s.Spec.Driver, gpuv1alpha1.MemoryBandwidthGBpsAttribute),
				FP32GFLOPS:    intAttribute(d, s.Spec.Driver, gpuv1alpha1.FP32GFLOPSAttribute),
				Taints:        d.Taints,
				HeldBy:        onDevice(holders[id], d, s.Spec.Driver),
			}
			if d.NodeName != nil {
				g.Node = *d.NodeName
			}
			if c, ok := deviceCapacity(d, s.Spec.Driver, gpuv1alpha1.MemoryCapacity); ok {
				g.Memory = &c
			}
			for _, set := range use.sets(id) {
				if whole[set] == id && len(partitions[set]) > 0 {
					g.MIG = use.mig(id, set, partitions[set], holders)
					break
				}
			}
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b GPU) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	return out
}

// mig sums up the partitions of the whole GPU gpu, which share counter
// set.
func (u counterUse) mig(gpu DeviceID, set counterSetKey, partitions []DeviceID, holders map[DeviceID][]Holder) *MIG {
	m := &MIG{Partitions: len(partitions)}
	for k := range u.total {
		if _, ok := memorySlice(k.name); ok && k.setKey() == set {
			m.MemorySlices++
		}
	}
	held := make(map[int]bool)
	for _, id := range append([]DeviceID{gpu}, partitions...) {
		if len(holders[id]) == 0 {
			continue
		}
		for _, n := range u.memorySlices(id) {
			held[n] = true
		}
	}
	m.MemorySlicesHeld = len(held)
	for _, id := range partitions {
		switch {
		case len(holders[id]) > 0:
			m.Held = append(m.Held, Partition{Device: id.Device, Label: u.label(id), HeldBy: holders[id]})
		case len(u.blockers(id, holders)) == 0:
			m.Free++
		}
	}
	slices.SortFunc(m.Held, func(a, b Partition) int { return cmp.Compare(a.Label, b.Label) })
	return m
}

// WriteFleet prints one row per GPU: NODE, DEVICE, PRODUCT, CLASS,
// BANDWIDTH, FP32, MEMORY, TAINTS and HELD BY, the holders with their share
// and the pods they are reserved for. With a GPU in MIG mode among them a
// MODE column sums up its partitions, and HELD BY names each partition
// held ("3g.20gb@0 ml/job-a (pod job-a-0)").
func WriteFleet(w io.Writer, gpus []GPU) error {
	mig := slices.ContainsFunc(gpus, func(g GPU) bool { return g.MIG != nil })
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	header := "NODE\tDEVICE\tPRODUCT\tCLASS\tBANDWIDTH\tFP32\tMEMORY\tTAINTS"
	if mig {
		header += "\tMODE"
	}
	fmt.Fprintln(tw, header+"\tHELD BY")
	for _, g := range gpus {
		cols := []string{g.Node, g.Device, dash(g.Product), dash(g.Class), bandwidth(g.BandwidthGBps), tflops(g.FP32GFLOPS), gib(g.Memory), taints(g.Taints)}
		held := fleetHolders(g.HeldBy)
		if mig {
			mode := "-"
			if g.MIG != nil {
				mode = g.MIG.Mode()
				held = migHolders(g.HeldBy, g.MIG.Held)
			}
			cols = append(cols, mode)
		}
		writeRow(tw, append(cols, held))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing GPU table: %w", err)
	}
	return nil
}

// migHolders is the HELD BY column of a GPU in MIG mode: the whole GPU's
// holders, then "3g.20gb@0 ml/job-a (pod job-a-0)" per partition held.
func migHolders(whole []Holder, held []Partition) string {
	var parts []string
	if len(whole) > 0 {
		parts = append(parts, fleetHolders(whole))
	}
	for _, p := range held {
		for _, h := range p.HeldBy {
			s := p.Label + " " + h.Claim()
			if pods := podsText(h.Pods); pods != "" {
				s += " (" + pods + ")"
			}
			parts = append(parts, s)
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

func sliceNode(s resourceapi.ResourceSlice) string {
	switch {
	case s.Spec.NodeName != nil:
		return *s.Spec.NodeName
	case s.Spec.AllNodes != nil && *s.Spec.AllNodes:
		return "<all nodes>"
	}
	return "<node selector>"
}

func intAttribute(d resourceapi.Device, driver string, name gpuv1alpha1.AttributeName) int64 {
	for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(driver + "/" + string(name))} {
		if a, ok := d.Attributes[key]; ok && a.IntValue != nil {
			return *a.IntValue
		}
	}
	return 0
}

func deviceCapacity(d resourceapi.Device, driver string, name gpuv1alpha1.CapacityName) (resource.Quantity, bool) {
	c, ok := deviceCapacityOf(d, driver, name)
	return c.Value, ok
}

// deviceCapacityOf looks a device capacity up under its short and its
// driver-qualified name.
func deviceCapacityOf(d resourceapi.Device, driver string, name gpuv1alpha1.CapacityName) (resourceapi.DeviceCapacity, bool) {
	for _, key := range []resourceapi.QualifiedName{resourceapi.QualifiedName(name), resourceapi.QualifiedName(driver + "/" + string(name))} {
		if c, ok := d.Capacity[key]; ok {
			return c, true
		}
	}
	return resourceapi.DeviceCapacity{}, false
}

func bandwidth(gbps int64) string {
	if gbps <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d GB/s", gbps)
}

func tflops(gflops int64) string {
	if gflops <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f TFLOPS", float64(gflops)/1000)
}

// gib prints memory in GiB with one decimal: NVML reports sizes such as
// 81559Mi that read badly as they are.
func gib(q *resource.Quantity) string {
	if q == nil {
		return "-"
	}
	return fmt.Sprintf("%.1fGi", float64(q.Value())/(1<<30))
}

func taints(ts []resourceapi.DeviceTaint) string {
	if len(ts) == 0 {
		return "-"
	}
	parts := make([]string, len(ts))
	for i, t := range ts {
		parts[i] = t.Key
		if t.Value != "" {
			parts[i] += "=" + t.Value
		}
		parts[i] += ":" + string(t.Effect)
	}
	return strings.Join(parts, ",")
}

// fleetHolders is "ml/train-0 (whole GPU; pod trainer-0)" per holder.
func fleetHolders(holders []Holder) string {
	if len(holders) == 0 {
		return "-"
	}
	parts := make([]string, len(holders))
	for i, h := range holders {
		detail := h.Share()
		if pods := podsText(h.Pods); pods != "" {
			detail += "; " + pods
		}
		parts[i] = fmt.Sprintf("%s (%s)", h.Claim(), detail)
	}
	return strings.Join(parts, ", ")
}

// podsText is "pod a", "pods a,b" or "".
func podsText(pods []string) string {
	switch len(pods) {
	case 0:
		return ""
	case 1:
		return "pod " + pods[0]
	}
	return "pods " + strings.Join(pods, ",")
}
