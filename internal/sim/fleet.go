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

package sim

import (
	"context"
	"fmt"

	v1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// FleetConfig is a simulated cluster of products from the built-in spec
// table: groups of identical nodes. test/bench lays out its fleets with
// it.
type FleetConfig struct {
	NodeGroups []NodeGroup `json:"nodeGroups"`
	// FiguresAsCapacity publishes the slices as the kubelet plugin does
	// with --figures-as-capacity.
	FiguresAsCapacity bool `json:"figuresAsCapacity,omitempty"`
}

// NodeGroup is Nodes identical nodes. Either Product and GPUsPerNode, or
// FleetFile (a demo/fleets-style file describing one node) is set.
type NodeGroup struct {
	// Name prefixes the node names; defaults to "group<i>".
	Name string `json:"name,omitempty"`
	// Product is a name from the built-in spec table, as NVML reports it.
	Product     string `json:"product,omitempty"`
	GPUsPerNode int    `json:"gpusPerNode,omitempty"`
	// FleetFile is a demo/fleets-style file describing one node.
	FleetFile string `json:"fleetFile,omitempty"`
	Nodes     int    `json:"nodes"`
}

// Cluster is a fleet laid out as nodes and the ResourceSlices the kubelet
// plugin would publish for them.
type Cluster struct {
	Nodes  []*Node
	Slices []*resourceapi.ResourceSlice
	// Templates are the distinct node kinds, one per node group.
	Templates []*Template
	GPUs      int
}

// Template is what the nodes of one group share.
type Template struct {
	Name string
	// Specs are the datasheet figures of each device, by device name.
	Specs map[string]gpu.Spec
	// Kinds are the distinct products on the node, sorted as listed; Kind
	// maps a device name to its index in Kinds.
	Kinds []string
	Kind  map[string]int
	GPUs  int
}

// Node is one simulated node.
type Node struct {
	Index    int
	Obj      *v1.Node
	Template *Template
	// Devices are the device names, in index order.
	Devices []string
}

// BuildCluster lays out the fleet. Each node's devices are built the way
// the kubelet plugin builds them: the simulated NVML backend, discovery,
// then gpu.ResourceDevices.
func BuildCluster(ctx context.Context, c *FleetConfig) (*Cluster, error) {
	cl := &Cluster{}
	if len(c.NodeGroups) == 0 {
		return nil, fmt.Errorf("fleet has no node groups")
	}
	for gi, g := range c.NodeGroups {
		name := g.Name
		if name == "" {
			name = fmt.Sprintf("group%d", gi)
		}
		var nf *nvml.Fleet
		switch {
		case g.FleetFile != "" && g.Product != "":
			return nil, fmt.Errorf("node group %s: set product or fleetFile, not both", name)
		case g.FleetFile != "":
			f, err := nvml.LoadFleet(g.FleetFile)
			if err != nil {
				return nil, fmt.Errorf("node group %s: %w", name, err)
			}
			nf = f
		case g.Product != "":
			spec, ok := gpu.LookupSpec(g.Product)
			if !ok {
				return nil, fmt.Errorf("node group %s: unknown product %q (known: %v)", name, g.Product, gpu.Products())
			}
			if g.GPUsPerNode < 1 {
				return nil, fmt.Errorf("node group %s: gpusPerNode must be at least 1", name)
			}
			nf = &nvml.Fleet{
				DriverVersion:     "550.54.15",
				CUDADriverVersion: 12040,
				GPUs: []nvml.GPUGroup{{
					Product: g.Product, Count: g.GPUsPerNode,
					NUMANodes: min(2, g.GPUsPerNode), NVLink: spec.NVLinks > 0,
				}},
			}
		default:
			return nil, fmt.Errorf("node group %s: product or fleetFile is required", name)
		}
		if g.Nodes < 1 {
			return nil, fmt.Errorf("node group %s: nodes must be at least 1", name)
		}
		tmpl := &Template{Name: name, Specs: map[string]gpu.Spec{}, Kind: map[string]int{}}
		productKind := map[string]int{}
		for n := range g.Nodes {
			nodeName := fmt.Sprintf("%s-%d", name, n)
			devices, err := discover(ctx, nf, nodeName, gpu.PublishOptions{FiguresAsCapacity: c.FiguresAsCapacity})
			if err != nil {
				return nil, fmt.Errorf("node group %s: %w", name, err)
			}
			node := &Node{Index: len(cl.Nodes), Obj: &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, Template: tmpl}
			for _, d := range devices {
				node.Devices = append(node.Devices, d.Name)
				if n > 0 {
					continue
				}
				product := ptr.Deref(d.Attributes[gpuv1alpha1.ProductNameAttribute.Qualified()].StringValue, "")
				spec, ok := gpu.LookupSpec(product)
				if !ok {
					return nil, fmt.Errorf("node group %s: device %s has no spec for product %q", name, d.Name, product)
				}
				tmpl.Specs[d.Name] = spec
				k, ok := productKind[product]
				if !ok {
					k = len(tmpl.Kinds)
					tmpl.Kinds = append(tmpl.Kinds, product)
					productKind[product] = k
				}
				tmpl.Kind[d.Name] = k
			}
			if n == 0 {
				tmpl.GPUs = len(devices)
				cl.Templates = append(cl.Templates, tmpl)
			}
			cl.GPUs += len(devices)
			cl.Nodes = append(cl.Nodes, node)
			cl.Slices = append(cl.Slices, &resourceapi.ResourceSlice{
				ObjectMeta: metav1.ObjectMeta{Name: nodeName + "-" + gpuv1alpha1.DriverName},
				Spec: resourceapi.ResourceSliceSpec{
					Driver:   gpuv1alpha1.DriverName,
					NodeName: ptr.To(nodeName),
					Pool:     resourceapi.ResourcePool{Name: nodeName, ResourceSliceCount: 1},
					Devices:  devices,
				},
			})
		}
	}
	return cl, nil
}

func discover(ctx context.Context, f *nvml.Fleet, nodeName string, publish gpu.PublishOptions) ([]resourceapi.Device, error) {
	s, err := nvml.NewSimulated(f, nodeName)
	if err != nil {
		return nil, err
	}
	devices, err := nvml.Discover(ctx, s, nvml.Options{})
	if err != nil {
		return nil, err
	}
	return gpu.ResourceDevices(ctx, devices, publish)
}
