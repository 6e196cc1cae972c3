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

package v1alpha1_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/explain"
	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
	"github.com/prismgpu/prism/pkg/rewrite"
)

// The tests in this file hold the two sides of the contract in
// attributes.go to each other: the kubelet plugin's devices, built by
// pkg/gpu for the simulated nodes of demo/fleets, against what the
// controller's rewrite, fleet view and explain read from them. A name
// changed on one side only fails one of them.

// node is one demo fleet file simulated as a node: the GPUs the plugin
// discovers, and its ResourceSlice as the plugin publishes it.
type node struct {
	name  string
	gpus  []gpu.Device
	slice resourceapi.ResourceSlice
}

// publish simulates every demo fleet and builds its devices with opts.
func publish(t *testing.T, opts gpu.PublishOptions) []node {
	t.Helper()
	// Discovery logs every node; a failure shows the diff, not those.
	ctx := klog.NewContext(t.Context(), logr.Discard())
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "demo", "fleets", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no demo fleets (%v)", err)
	}
	var out []node
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		gpus, sysfs, err := nvml.NewFleetInventory(f, name).Read(ctx)
		if err != nil {
			t.Fatalf("simulating %s: %v", f, err)
		}
		opts.SysFS = sysfs
		devices, err := gpu.ResourceDevices(ctx, gpus, opts)
		if err != nil {
			t.Fatalf("publishing %s: %v", f, err)
		}
		out = append(out, node{name: name, gpus: gpus, slice: resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-" + gpuv1alpha1.DriverName, UID: types.UID(name)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:   gpuv1alpha1.DriverName,
				Pool:     resourceapi.ResourcePool{Name: name, Generation: 1, ResourceSliceCount: 1},
				NodeName: ptr.To(name),
				Devices:  devices,
			},
		}})
	}
	return out
}

// publishMIG simulates every demo fleet with its MIG-capable GPUs in MIG
// mode and builds their partitions, which carry the partition-only names.
func publishMIG(t *testing.T) []node {
	t.Helper()
	ctx := klog.NewContext(t.Context(), logr.Discard())
	files, err := filepath.Glob(filepath.Join("..", "..", "..", "demo", "fleets", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no demo fleets (%v)", err)
	}
	migProducts := map[string]bool{}
	for _, p := range nvml.SimulatedMIGProducts() {
		migProducts[p] = true
	}
	var out []node
	for _, f := range files {
		fleet, err := nvml.LoadFleet(f)
		if err != nil {
			t.Fatal(err)
		}
		for i := range fleet.GPUs {
			fleet.GPUs[i].MIGMode = migProducts[fleet.GPUs[i].Product]
		}
		name := strings.TrimSuffix(filepath.Base(f), ".yaml") + "-mig"
		sim, err := nvml.NewSimulated(fleet, name)
		if err != nil {
			t.Fatalf("simulating %s in MIG mode: %v", f, err)
		}
		gpus, err := nvml.Discover(ctx, sim, nvml.Options{})
		if err != nil {
			t.Fatalf("discovering %s in MIG mode: %v", f, err)
		}
		content, err := gpu.ResourceSlices(ctx, gpus, gpu.PublishOptions{SysFS: sim.SysFS()})
		if err != nil {
			t.Fatalf("publishing %s in MIG mode: %v", f, err)
		}
		for _, c := range content {
			out = append(out, node{name: name, gpus: gpus, slice: resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{Devices: c.Devices}}})
		}
	}
	return out
}

// Both ways the plugin can publish memory: whole GPUs with the figures as
// capacities too (--figures-as-capacity, for the controller's tier bounds
// as capacity requests), and GPUs shareable by memory
// (--consumable-capacity).
var (
	figuresAsCapacity = gpu.PublishOptions{FiguresAsCapacity: true}
	shareMemory       = gpu.PublishOptions{ShareMemory: true}
)

// names are the attribute and capacity names of a set of devices, sorted.
type names struct {
	Attributes, Capacities []resourceapi.QualifiedName
}

func namesOf(nodes ...[]node) names {
	attrs, caps := map[resourceapi.QualifiedName]bool{}, map[resourceapi.QualifiedName]bool{}
	for _, ns := range nodes {
		for _, n := range ns {
			for _, d := range n.slice.Spec.Devices {
				for a := range d.Attributes {
					attrs[a] = true
				}
				for c := range d.Capacity {
					caps[c] = true
				}
			}
		}
	}
	return names{Attributes: sortedKeys(attrs), Capacities: sortedKeys(caps)}
}

func sortedKeys(m map[resourceapi.QualifiedName]bool) []resourceapi.QualifiedName {
	out := make([]resourceapi.QualifiedName, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// Attributes and Capacities list every constant of attributes.go, since
// the test below takes them as the contract.
func TestListsHoldEveryName(t *testing.T) {
	file, err := parser.ParseFile(token.NewFileSet(), "attributes.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := map[string][]string{}
	values := map[string]string{}
	for _, decl := range file.Decls {
		gd, ok := decl.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				typ, value := "", ""
				if id, ok := vs.Type.(*ast.Ident); ok {
					typ = id.Name
				}
				switch v := vs.Values[i].(type) {
				case *ast.BasicLit:
					value, _ = strconv.Unquote(v.Value)
				case *ast.CallExpr: // CapacityName(SomeAttribute)
					typ = v.Fun.(*ast.Ident).Name
					value = values[v.Args[0].(*ast.Ident).Name]
				}
				values[name.Name] = value
				if typ == "AttributeName" || typ == "CapacityName" {
					declared[typ] = append(declared[typ], value)
				}
			}
		}
	}
	listed := map[string][]string{}
	for _, a := range gpuv1alpha1.Attributes() {
		listed["AttributeName"] = append(listed["AttributeName"], string(a))
	}
	for _, c := range gpuv1alpha1.Capacities() {
		listed["CapacityName"] = append(listed["CapacityName"], string(c))
	}
	for _, l := range []map[string][]string{declared, listed} {
		for _, names := range l {
			slices.Sort(names)
		}
	}
	if diff := cmp.Diff(declared, listed); diff != "" {
		t.Errorf("Attributes and Capacities differ from the constants (-declared +listed):\n%s", diff)
	}
}

// Every name the plugin publishes is one the contract knows, and every name
// the contract knows is published by some GPU of the demo fleets, so that
// the tests below see each of them.
func TestPublishedNamesAreTheContract(t *testing.T) {
	var want names
	for _, a := range gpuv1alpha1.Attributes() {
		want.Attributes = append(want.Attributes, a.Qualified())
	}
	// The two standard Kubernetes attributes are upstream's contract.
	want.Attributes = append(want.Attributes, deviceattribute.StandardDeviceAttributePCIBusID, deviceattribute.StandardDeviceAttributePCIeRoot)
	for _, c := range gpuv1alpha1.Capacities() {
		want.Capacities = append(want.Capacities, c.Qualified())
	}
	slices.Sort(want.Attributes)
	slices.Sort(want.Capacities)

	got := namesOf(publish(t, figuresAsCapacity), publish(t, shareMemory), publishMIG(t))
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("names the plugin publishes differ from those in attributes.go (-contract +published):\n%s", diff)
	}
}

// celName finds the attributes and capacities a CEL expression reads in the
// driver's domain: device.attributes["gpu.prism.dev"].<name>, and the
// guard "<name>" in device.attributes["gpu.prism.dev"].
var celName = regexp.MustCompile(`(?:"(\w+)" in )?device\.(attributes|capacity)\["` + regexp.QuoteMeta(gpuv1alpha1.DriverName) + `"\](?:\.(\w+))?`)

// Every attribute and capacity a selector of rewrite's catalogue reads is
// published.
func TestRewriteCatalogueReadsPublishedNames(t *testing.T) {
	published := namesOf(publish(t, figuresAsCapacity), publish(t, shareMemory), publishMIG(t))
	var unknown []string
	for _, expr := range rewrite.Catalogue() {
		matches := celName.FindAllStringSubmatch(expr, -1)
		if len(matches) == 0 {
			t.Errorf("catalogue selector %q reads no %s attribute or capacity that this test can find", expr, gpuv1alpha1.DriverName)
		}
		for _, m := range matches {
			in := published.Attributes
			if m[2] == "capacity" {
				in = published.Capacities
			}
			for _, name := range []string{m[1], m[3]} {
				q := resourceapi.QualifiedName(gpuv1alpha1.DriverName + "/" + name)
				if name != "" && !slices.Contains(in, q) && !slices.Contains(unknown, m[2]+" "+string(q)) {
					unknown = append(unknown, m[2]+" "+string(q))
				}
			}
		}
	}
	if diff := cmp.Diff([]string(nil), unknown); diff != "" {
		t.Errorf("rewrite's catalogue reads names no GPU publishes (-want +got):\n%s", diff)
	}
}

// Every capacity a claim rewritten with the capacity forms requests, and
// the attribute its guard constraint matches, are published.
func TestRewriteWritesPublishedNames(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	claim := &resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: rewrite.DeviceClassName, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
	}}}}
	floor := resource.MustParse("20Gi")
	for _, tc := range []struct {
		name    string
		opts    gpu.PublishOptions
		profile rewrite.Profile
	}{
		{"floors and tier bounds as capacity requests", figuresAsCapacity,
			rewrite.Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeMemoryBound, MinMemory: &floor, MinComputeCapability: "8.0"}},
		{"a memory share", shareMemory,
			rewrite.Profile{Name: "p", BoundType: prismv1alpha1.BoundTypeComputeBound, MinMemory: &floor, ShareMemory: true}},
		{"a share sized from usage", shareMemory,
			rewrite.Profile{Name: "p", Usage: &prismv1alpha1.UsageProfile{Runs: 1, DutyCycleP95MilliPercent: ptr.To(int32(30_000)), PeakMemory: &floor}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := publish(t, tc.opts)
			published := namesOf(nodes)
			view := fleet.NewView()
			for _, n := range nodes {
				view.OnAdd(&n.slice, false)
			}
			out, _, err := rewrite.Rewrite(ctx, claim, tc.profile, rewrite.WithFleet(view.Fleet()), rewrite.MemoryFloorAsCapacity(), rewrite.TierBoundsAsCapacity(), rewrite.ShareFromUsage())
			if err != nil {
				t.Fatalf("Rewrite: %v", err)
			}
			var capacities, attributes []resourceapi.QualifiedName
			for _, r := range out.Devices.Requests {
				for _, sub := range r.FirstAvailable {
					if sub.Capacity != nil {
						capacities = append(capacities, slices.Collect(maps.Keys(sub.Capacity.Requests))...)
					}
				}
				if r.Exactly != nil && r.Exactly.Capacity != nil {
					capacities = append(capacities, slices.Collect(maps.Keys(r.Exactly.Capacity.Requests))...)
				}
			}
			for _, c := range out.Devices.Constraints {
				if c.MatchAttribute != nil {
					attributes = append(attributes, resourceapi.QualifiedName(*c.MatchAttribute))
				}
			}
			if len(capacities) == 0 {
				t.Fatalf("the rewritten claim requests no capacity, so this test checks nothing: %+v", out.Devices)
			}
			if diff := cmp.Diff([]resourceapi.QualifiedName(nil), notIn(capacities, published.Capacities)); diff != "" {
				t.Errorf("the rewritten claim requests capacities no GPU publishes (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]resourceapi.QualifiedName(nil), notIn(attributes, published.Attributes)); diff != "" {
				t.Errorf("the rewritten claim's constraints match attributes no GPU publishes (-want +got):\n%s", diff)
			}
		})
	}
}

// notIn is the sorted names of got that are not in published.
func notIn(got, published []resourceapi.QualifiedName) []resourceapi.QualifiedName {
	var out []resourceapi.QualifiedName
	for _, n := range got {
		if !slices.Contains(published, n) && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// The fleet view, through the informer's transform (fleet.TrimSlice), sees
// every model with the figures the plugin knows of its GPUs.
func TestFleetViewReadsPublishedNames(t *testing.T) {
	nodes := publish(t, figuresAsCapacity)
	view := fleet.NewView()
	models := map[string]rewrite.Model{}
	for _, n := range nodes {
		trimmed, err := fleet.TrimSlice(&n.slice)
		if err != nil {
			t.Fatalf("TrimSlice: %v", err)
		}
		view.OnAdd(trimmed, false)
		products := map[string]bool{}
		for _, g := range n.gpus {
			products[g.ProductName] = true
		}
		for _, g := range n.gpus {
			m := models[g.ProductName]
			m.Name = g.ProductName
			m.Devices++
			m.FigureCapacityDevices++
			if len(products) > 1 {
				m.MixedDevices++
			}
			m.BandwidthGBps = int64(g.MemoryBandwidthGBps())
			m.FP32GFLOPS = int64(g.FP32GFLOPS())
			m.MemoryBytes = max(m.MemoryBytes, int64(g.MemoryBytes))
			m.Multiprocessors = int64(g.MultiprocessorCount)
			models[g.ProductName] = m
		}
	}
	want := &rewrite.Fleet{}
	for _, m := range models {
		want.Models = append(want.Models, m)
	}
	slices.SortFunc(want.Models, func(a, b rewrite.Model) int { return strings.Compare(a.Name, b.Name) })
	if diff := cmp.Diff(want, view.Fleet()); diff != "" {
		t.Errorf("the fleet view does not read what the plugin published (-plugin +view):\n%s", diff)
	}
}

// explain's fleet table shows every GPU with the figures the plugin knows.
func TestExplainReadsPublishedNames(t *testing.T) {
	nodes := publish(t, figuresAsCapacity)
	type row struct {
		Node, Device, Product, Class string
		BandwidthGBps, FP32GFLOPS    int64
		Memory                       string
	}
	var want, got []row
	var published []resourceapi.ResourceSlice
	for _, n := range nodes {
		published = append(published, n.slice)
		for _, g := range n.gpus {
			want = append(want, row{n.name, g.Name(), g.ProductName, g.BandwidthClass(), int64(g.MemoryBandwidthGBps()), int64(g.FP32GFLOPS()),
				resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI).String()})
		}
	}
	for _, g := range explain.Fleet(published, nil) {
		r := row{g.Node, g.Device, g.Product, g.Class, g.BandwidthGBps, g.FP32GFLOPS, ""}
		if g.Memory != nil {
			r.Memory = g.Memory.String()
		}
		got = append(got, r)
	}
	byNodeDevice := func(a, b row) int { return strings.Compare(a.Node+"/"+a.Device, b.Node+"/"+b.Device) }
	slices.SortFunc(want, byNodeDevice)
	slices.SortFunc(got, byNodeDevice)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("explain does not read what the plugin published (-plugin +explain):\n%s", diff)
	}
}
