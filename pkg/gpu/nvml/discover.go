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

// Package nvml discovers GPUs through NVML. The only seam is go-nvml's own
// nvml.Interface: New loads the real library, NewSimulated builds one from
// a fleet file on top of go-nvml's mocks, and Discover cannot tell them
// apart.
package nvml

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/gpu"
)

// Options tunes Discover.
type Options struct {
	// LookupSpec supplies datasheet figures for fields NVML cannot report
	// on a given board or driver. Defaults to gpu.LookupSpec.
	LookupSpec func(product string) (gpu.Spec, bool)
}

// UnreadableError lists the GPUs Discover could not read. It comes with
// the GPUs that could be read: one failing GPU (fallen off the bus, most
// often) must not hide the healthy ones.
type UnreadableError struct {
	// GPUs maps a GPU's index to why it could not be read.
	GPUs map[int]error
}

func (e *UnreadableError) Error() string {
	parts := make([]string, 0, len(e.GPUs))
	for _, i := range slices.Sorted(maps.Keys(e.GPUs)) {
		parts = append(parts, fmt.Sprintf("reading GPU %d: %v", i, e.GPUs[i]))
	}
	return strings.Join(parts, "; ")
}

// Discover reads every GPU NVML can see, sorted by index. A field NVML
// cannot report (ERROR_NOT_SUPPORTED, a symbol missing from an old driver,
// ...) is taken from the spec table; a GPU without the fields that identify
// it or hand it to a container is left out and reported in an
// *UnreadableError, returned with the GPUs that were read.
func Discover(ctx context.Context, lib nvml.Interface, opts Options) ([]gpu.Device, error) {
	logger := klog.FromContext(ctx)
	if opts.LookupSpec == nil {
		opts.LookupSpec = gpu.LookupSpec
	}

	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("initializing NVML: %w", ret)
	}
	defer func() {
		if ret := lib.Shutdown(); ret != nvml.SUCCESS {
			logger.Error(ret, "Shutting down NVML")
		}
	}()

	driverVersion, ret := lib.SystemGetDriverVersion()
	if ret != nvml.SUCCESS {
		logger.Info("NVML cannot report the driver version; not publishing it", "err", ret)
		driverVersion = ""
	}
	cudaDriverVersion := ""
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == nvml.SUCCESS && v > 0 {
		// NVML encodes CUDA 12.4 as 12040.
		cudaDriverVersion = fmt.Sprintf("%d.%d", v/1000, (v%1000)/10)
	} else {
		logger.Info("NVML cannot report the CUDA driver version; not publishing it", "err", ret)
	}

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("counting GPUs: %w", ret)
	}

	devices := make([]gpu.Device, 0, count)
	links := make([][]string, 0, count)
	unreadable := map[int]error{}
	for i := range count {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("discovering GPUs: %w", err)
		}
		h, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			unreadable[i] = fmt.Errorf("getting handle: %w", ret)
			continue
		}
		d, peers, err := readDevice(klog.LoggerWithValues(logger, "index", i), h, i, opts.LookupSpec)
		if err != nil {
			unreadable[i] = err
			continue
		}
		d.DriverVersion = driverVersion
		d.CUDADriverVersion = cudaDriverVersion
		devices = append(devices, d)
		links = append(links, peers)
	}
	assignNVLinkDomains(devices, links)
	gpu.SortByIndex(devices)
	logger.V(2).Info("Discovered GPUs", "count", len(devices), "unreadable", len(unreadable))
	if len(unreadable) > 0 {
		return devices, &UnreadableError{GPUs: unreadable}
	}
	return devices, nil
}

// readDevice returns the device and the PCI bus IDs at the far end of its
// active NVLinks.
func readDevice(logger klog.Logger, h nvml.Device, index int, lookup func(string) (gpu.Spec, bool)) (gpu.Device, []string, error) {
	d := gpu.Device{Index: index}
	var ret nvml.Return

	// Identity: without these the GPU cannot be named, matched to a
	// container device node, or located on the bus.
	if d.ProductName, ret = h.GetName(); ret != nvml.SUCCESS {
		return d, nil, fmt.Errorf("getting name: %w", ret)
	}
	if d.UUID, ret = h.GetUUID(); ret != nvml.SUCCESS {
		return d, nil, fmt.Errorf("getting UUID: %w", ret)
	}
	if d.Minor, ret = h.GetMinorNumber(); ret != nvml.SUCCESS {
		return d, nil, fmt.Errorf("getting minor number: %w", ret)
	}
	pci, ret := h.GetPciInfo()
	if ret != nvml.SUCCESS {
		return d, nil, fmt.Errorf("getting PCI info: %w", ret)
	}
	d.PCIBusID = busID(pci)

	spec, known := lookup(d.ProductName)
	var fromSpec, missing []string
	// fallback records where a field came from, so that a node reporting
	// odd figures can be explained from its log.
	fallback := func(field string, ret nvml.Return, apply func()) {
		if ret == nvml.SUCCESS {
			return
		}
		if known {
			apply()
			fromSpec = append(fromSpec, field)
		} else {
			missing = append(missing, field)
		}
		if ret != nvml.ERROR_NOT_SUPPORTED && ret != nvml.ERROR_FUNCTION_NOT_FOUND {
			logger.Info("NVML call failed; using fallback", "field", field, "err", ret)
		}
	}

	brand, ret := h.GetBrand()
	if ret == nvml.SUCCESS {
		if d.Brand = brands[brand]; d.Brand == "" {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}
	fallback("brand", ret, func() { d.Brand = spec.Brand })

	major, minor, ret := h.GetCudaComputeCapability()
	d.CUDAComputeCapability = gpu.ComputeCapability{Major: major, Minor: minor}
	fallback("cudaComputeCapability", ret, func() { d.CUDAComputeCapability = spec.ComputeCapability })

	arch, ret := h.GetArchitecture()
	if ret == nvml.SUCCESS {
		if d.Architecture = architectures[arch]; d.Architecture == "" {
			ret = nvml.ERROR_NOT_SUPPORTED
		}
	}
	fallback("architecture", ret, func() { d.Architecture = spec.Architecture })

	mem, ret := h.GetMemoryInfo()
	d.MemoryBytes = mem.Total
	fallback("memory", ret, func() { d.MemoryBytes = spec.MemoryBytes() })

	width, ret := h.GetMemoryBusWidth()
	d.MemoryBusWidthBits = int(width)
	fallback("memoryBusWidth", ret, func() { d.MemoryBusWidthBits = spec.MemoryBusWidthBits })

	memClock, ret := h.GetMaxClockInfo(nvml.CLOCK_MEM)
	d.MaxMemoryClockMHz = int(memClock)
	fallback("maxMemoryClock", ret, func() { d.MaxMemoryClockMHz = spec.MaxMemoryClockMHz })

	smClock, ret := h.GetMaxClockInfo(nvml.CLOCK_SM)
	d.MaxSMClockMHz = int(smClock)
	fallback("maxSMClock", ret, func() { d.MaxSMClockMHz = spec.MaxSMClockMHz })

	// nvmlDeviceGetAttributes is documented for MIG devices and many
	// drivers answer NOT_SUPPORTED for a whole GPU.
	attrs, ret := h.GetAttributes()
	if ret == nvml.SUCCESS && attrs.MultiprocessorCount == 0 {
		ret = nvml.ERROR_NOT_SUPPORTED
	}
	d.MultiprocessorCount = int(attrs.MultiprocessorCount)
	fallback("multiprocessorCount", ret, func() { d.MultiprocessorCount = spec.MultiprocessorCount })

	gen, ret := h.GetMaxPcieLinkGeneration()
	d.PCIeGeneration = gen
	fallback("pcieGeneration", ret, func() { d.PCIeGeneration = spec.PCIeGeneration })

	lanes, ret := h.GetMaxPcieLinkWidth()
	d.PCIeLinkWidth = lanes
	fallback("pcieLinkWidth", ret, func() { d.PCIeLinkWidth = spec.PCIeLinkWidth })

	// MIG capability is whether the mode can be queried at all, not
	// whether it is currently on.
	_, _, ret = h.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		d.MIGCapable = true
	case nvml.ERROR_NOT_SUPPORTED:
		d.MIGCapable = false
	default:
		fallback("migCapable", ret, func() { d.MIGCapable = spec.MIGCapable })
	}
	if d.MIGCapable {
		d.MIG = readMIG(logger, h, d.MemoryBytes)
		if note := d.MIGNote(); note != "" {
			logger.V(2).Info("GPU is published whole", "reason", note)
		}
	}

	// The spec table cannot know how a board is wired into a host.
	if node, ret := h.GetNumaNodeId(); ret == nvml.SUCCESS && node >= 0 {
		d.NUMANode = ptr.To(node)
	}

	var peers []string
	for link := range nvml.NVLINK_MAX_LINKS {
		// Links a board does not have answer INVALID_ARGUMENT or
		// NOT_SUPPORTED; either way they carry no traffic.
		state, ret := h.GetNvLinkState(link)
		if ret != nvml.SUCCESS || state != nvml.FEATURE_ENABLED {
			continue
		}
		remote, ret := h.GetNvLinkRemotePciInfo(link)
		if ret != nvml.SUCCESS {
			logger.Info("NVLink is up but its far end is unknown; ignoring it", "link", link, "err", ret)
			continue
		}
		peers = append(peers, busID(remote))
	}

	if len(fromSpec) > 0 {
		logger.V(2).Info("Took fields NVML could not report from the spec table", "product", d.ProductName, "fields", fromSpec)
	}
	if len(missing) > 0 {
		logger.Info("Product is not in the spec table; fields NVML could not report are left unpublished", "product", d.ProductName, "fields", missing)
	}
	return d, peers, nil
}

// assignNVLinkDomains numbers the connected components of the NVLink graph.
// Links are recorded by PCI bus ID of their far end, which is a GPU for a
// bridge and an NVSwitch otherwise, so two GPUs on the same switch fabric
// end up in one component without either naming the other. Domains are
// numbered in order of their lowest GPU index, which keeps them stable
// across restarts.
func assignNVLinkDomains(devices []gpu.Device, links [][]string) {
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		p, ok := parent[x]
		if !ok || p == x {
			parent[x] = x
			return x
		}
		root := find(p)
		parent[x] = root
		return root
	}
	for i, peers := range links {
		for _, p := range peers {
			parent[find(p)] = find(devices[i].PCIBusID)
		}
	}

	order := make([]int, len(devices))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return devices[a].Index - devices[b].Index })
	domains := map[string]int{}
	for _, i := range order {
		if len(links[i]) == 0 {
			continue
		}
		root := find(devices[i].PCIBusID)
		id, ok := domains[root]
		if !ok {
			id = len(domains)
			domains[root] = id
		}
		devices[i].NVLinkDomain = ptr.To(id)
	}
}

// busID renders NVML's bus ID ("00000000:07:00.0") the way sysfs and the
// Kubernetes standard attribute spell it ("0000:07:00.0").
func busID(pci nvml.PciInfo) string {
	b := make([]byte, 0, len(pci.BusId))
	for _, c := range pci.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	var domain, bus, dev, fn uint32
	if _, err := fmt.Sscanf(string(b), "%x:%x:%x.%x", &domain, &bus, &dev, &fn); err != nil {
		// Keep what NVML said; publishing will drop it with a reason.
		return strings.ToLower(string(b))
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", domain, bus, dev, fn)
}

// brands and architectures spell NVML enums the way nvidia-smi does. The
// simulated backend serves them in reverse.
var brands = map[nvml.BrandType]string{
	nvml.BRAND_QUADRO:      "Quadro",
	nvml.BRAND_TESLA:       "Tesla",
	nvml.BRAND_NVS:         "NVS",
	nvml.BRAND_GRID:        "GRID",
	nvml.BRAND_GEFORCE:     "GeForce",
	nvml.BRAND_TITAN:       "Titan",
	nvml.BRAND_QUADRO_RTX:  "Quadro RTX",
	nvml.BRAND_NVIDIA_RTX:  "NVIDIA RTX",
	nvml.BRAND_NVIDIA:      "NVIDIA",
	nvml.BRAND_GEFORCE_RTX: "GeForce RTX",
	nvml.BRAND_TITAN_RTX:   "Titan RTX",
}

var architectures = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER:    "Kepler",
	nvml.DEVICE_ARCH_MAXWELL:   "Maxwell",
	nvml.DEVICE_ARCH_PASCAL:    "Pascal",
	nvml.DEVICE_ARCH_VOLTA:     "Volta",
	nvml.DEVICE_ARCH_TURING:    "Turing",
	nvml.DEVICE_ARCH_AMPERE:    "Ampere",
	nvml.DEVICE_ARCH_ADA:       "Ada Lovelace",
	nvml.DEVICE_ARCH_HOPPER:    "Hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "Blackwell",
	nvml.DEVICE_ARCH_RUBIN:     "Rubin",
}
