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

// GPU is one published device with the claims that hold it.
type GPU struct {
	Node, Pool, Device string
	Product, Class     string
	// BandwidthGBps and FP32GFLOPS are 0 when not published.
	BandwidthGBps, FP32GFLOPS int64
	// Memory is nil when not published.
	Memory *resource.Quantity
	Taints []resourceapi.DeviceTaint
	HeldBy []Holder
}

// Fleet lists every device of slices, current pool generations only, with
// its holders (from Holders), sorted by node and device.
func Fleet(resourceSlices []resourceapi.ResourceSlice, holders map[DeviceID][]Holder) []GPU {
	var out []GPU
	for _, s := range currentSlices(resourceSlices) {
		for _, d := range s.Spec.Devices {
			g := GPU{
				Node: sliceNode(s), Pool: s.Spec.Pool.Name, Device: d.Name,
				Product:       stringAttribute(d, s.Spec.Driver, gpuv1alpha1.ProductNameAttribute),
				Class:         stringAttribute(d, s.Spec.Driver, gpuv1alpha1.BandwidthClassAttribute),
				BandwidthGBps: intAttribute(d, s.Spec.Driver, gpuv1alpha1.MemoryBandwidthGBpsAttribute),
				FP32GFLOPS:    intAttribute(d, s.Spec.Driver, gpuv1alpha1.FP32GFLOPSAttribute),
				Taints:        d.Taints,
				HeldBy:        onDevice(holders[DeviceID{Driver: s.Spec.Driver, Pool: s.Spec.Pool.Name, Device: d.Name}], d, s.Spec.Driver),
			}
			if d.NodeName != nil {
				g.Node = *d.NodeName
			}
			if c, ok := deviceCapacity(d, s.Spec.Driver, gpuv1alpha1.MemoryCapacity); ok {
				g.Memory = &c
			}
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b GPU) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pool, b.Pool), cmp.Compare(a.Device, b.Device))
	})
	return out
}

// WriteFleet prints one row per GPU: NODE, DEVICE, PRODUCT, CLASS,
// BANDWIDTH, FP32, MEMORY, TAINTS and HELD BY, the holders with their share
// and the pods they are reserved for.
func WriteFleet(w io.Writer, gpus []GPU) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tDEVICE\tPRODUCT\tCLASS\tBANDWIDTH\tFP32\tMEMORY\tTAINTS\tHELD BY")
	for _, g := range gpus {
		cols := []string{g.Node, g.Device, dash(g.Product), dash(g.Class), bandwidth(g.BandwidthGBps), tflops(g.FP32GFLOPS), gib(g.Memory), taints(g.Taints), fleetHolders(g.HeldBy)}
		for i := range cols {
			cols[i] = clean(cols[i])
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing GPU table: %w", err)
	}
	return nil
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
		switch len(h.Pods) {
		case 0:
		case 1:
			detail += "; pod " + h.Pods[0]
		default:
			detail += "; pods " + strings.Join(h.Pods, ",")
		}
		parts[i] = fmt.Sprintf("%s (%s)", h.Claim(), detail)
	}
	return strings.Join(parts, ", ")
}
