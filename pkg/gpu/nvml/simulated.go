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
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"path"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/prismgpu/prism/pkg/gpu"
)

// simulatedSwitchesPerIsland is how many NVSwitches a simulated island
// has. Only connectivity matters to discovery, so the figure is cosmetic.
const simulatedSwitchesPerIsland = 4

// Simulated is an nvml.Interface that serves a Fleet through go-nvml's
// mocks, so that discovery runs the same NVML calls as on real hardware.
type Simulated struct {
	*mock.Interface

	devices []*mock.Device
	sysfs   sysFS
}

var _ nvml.Interface = (*Simulated)(nil)

// simulatedGPU is everything a simulated board reports.
type simulatedGPU struct {
	spec     gpu.Spec
	index    int
	uuid     string
	bus      busAddress
	numaNode int // -1 when the platform reports none
	nvlinkTo []busAddress
	pcieRoot string
	pcieSlot string
	// mig holds the board's MIG profiles when it is in MIG mode.
	mig []simulatedProfile
}

type busAddress struct {
	domain, bus, device, function uint32
}

func (a busAddress) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.device, a.function)
}

func (a busAddress) pciInfo() nvml.PciInfo {
	info := nvml.PciInfo{Domain: a.domain, Bus: a.bus, Device: a.device}
	// NVML spells the domain with eight digits and upper-case hex.
	id := fmt.Sprintf("%08X:%02X:%02X.%X", a.domain, a.bus, a.device, a.function)
	for i := 0; i < len(id) && i < len(info.BusId)-1; i++ {
		info.BusId[i] = int8(id[i])
	}
	return info
}

// NewSimulated lays out the fleet as one node. nodeName seeds the GPU
// UUIDs, so two simulated nodes never share a UUID while a restarted node
// keeps its own.
func NewSimulated(fleet *Fleet, nodeName string) (*Simulated, error) {
	if nodeName == "" {
		return nil, fmt.Errorf("simulating fleet: node name is required to derive GPU UUIDs")
	}
	if err := fleet.Validate(); err != nil {
		return nil, fmt.Errorf("simulating fleet: %w", err)
	}

	var gpus []*simulatedGPU
	island := 0
	for _, g := range fleet.GPUs {
		spec, _ := gpu.LookupSpec(g.Product)
		islandSize := g.NVLinkIslandSize
		if islandSize == 0 {
			islandSize = g.Count
		}
		first := len(gpus)
		for j := range g.Count {
			i := len(gpus)
			// Two GPUs per PCIe root complex, each behind its own
			// bridge, roughly like a dual-socket 8-GPU server.
			rootBus := uint32(0x20 * (i / 2))
			sg := &simulatedGPU{
				spec:     spec,
				index:    i,
				uuid:     simulatedUUID(nodeName, i, g.Product),
				bus:      busAddress{bus: rootBus + 0x07 + 0x08*uint32(i%2)},
				numaNode: -1,
				pcieRoot: fmt.Sprintf("pci0000:%02x", rootBus),
				pcieSlot: fmt.Sprintf("0000:%02x:%02x.0", rootBus, 1+i%2),
			}
			if g.MIGMode {
				sg.mig = simulatedMIGProfiles[g.Product]
			}
			if g.NUMANodes > 0 {
				sg.numaNode = j * g.NUMANodes / g.Count
			}
			gpus = append(gpus, sg)
		}
		if !g.NVLink {
			continue
		}
		for start := first; start < len(gpus); start += islandSize {
			members := gpus[start : start+islandSize]
			if islandSize == 2 {
				for k, sg := range members {
					peer := members[1-k].bus
					for range spec.NVLinks {
						sg.nvlinkTo = append(sg.nvlinkTo, peer)
					}
				}
			} else {
				for _, sg := range members {
					for l := range spec.NVLinks {
						// Switches sit in a PCI domain of their own per island
						// so that they can never alias a GPU.
						sg.nvlinkTo = append(sg.nvlinkTo, busAddress{domain: uint32(0x100 + island), bus: uint32(1 + l%simulatedSwitchesPerIsland)})
					}
				}
			}
			island++
		}
	}

	s := &Simulated{sysfs: sysFS{}}
	instances := newSimulatedInstances(fleet.MIGRecordFile)
	for _, sg := range gpus {
		dev := sg.mock()
		if sg.mig != nil {
			instances.wire(dev, sg.uuid, sg.mig)
		}
		s.devices = append(s.devices, dev)
		s.addToSysFS(sg)
	}
	s.Interface = &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			return fleet.DriverVersion, nvml.SUCCESS
		},
		SystemGetCudaDriverVersionFunc: func() (int, nvml.Return) {
			return fleet.CUDADriverVersion, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) {
			return len(s.devices), nvml.SUCCESS
		},
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			if i < 0 || i >= len(s.devices) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return s.devices[i], nvml.SUCCESS
		},
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			for i, sg := range gpus {
				if sg.uuid == uuid {
					return s.devices[i], nvml.SUCCESS
				}
			}
			return nil, nvml.ERROR_NOT_FOUND
		},
	}
	s.simulateUsage(fleet.UsageFile, gpus)
	return s, nil
}

// Devices returns the per-GPU mocks in index order. Callers may replace
// their function fields, which is how events such as XID errors or a lost
// GPU are meant to be injected: wire EventSetCreateFunc and
// DeviceRegisterEventsFunc on the Interface and have the EventSet's
// WaitFunc deliver events for these devices.
func (s *Simulated) Devices() []*mock.Device {
	return s.devices
}

// SysFS is a sysfs tree that places each simulated GPU under a PCIe root
// complex, for gpu.PublishOptions.SysFS.
func (s *Simulated) SysFS() fs.ReadLinkFS {
	return s.sysfs
}

func (s *Simulated) addToSysFS(sg *simulatedGPU) {
	bdf := sg.bus.String()
	dir := path.Join("devices", sg.pcieRoot, sg.pcieSlot, bdf)
	s.sysfs.addFile(path.Join(dir, "numa_node"), fmt.Appendf(nil, "%d\n", sg.numaNode))
	s.sysfs.addLink(path.Join("bus/pci/devices", bdf), path.Join("../../..", dir))
}

func simulatedUUID(nodeName string, index int, product string) string {
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%s", nodeName, index, product))
	h := hex.EncodeToString(sum[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", h[0:8], h[8:12], h[12:16], h[16:20], h[20:32])
}

func (sg *simulatedGPU) mock() *mock.Device {
	spec := sg.spec
	brand, arch := nvml.BRAND_UNKNOWN, nvml.DeviceArchitecture(nvml.DEVICE_ARCH_UNKNOWN)
	for b, name := range brands {
		if name == spec.Brand {
			brand = b
		}
	}
	for a, name := range architectures {
		if name == spec.Architecture {
			arch = a
		}
	}
	profileInfo, possiblePlacements := migFuncs(sg.mig)
	return &mock.Device{
		GetNameFunc:        func() (string, nvml.Return) { return spec.Product, nvml.SUCCESS },
		GetUUIDFunc:        func() (string, nvml.Return) { return sg.uuid, nvml.SUCCESS },
		GetIndexFunc:       func() (int, nvml.Return) { return sg.index, nvml.SUCCESS },
		GetMinorNumberFunc: func() (int, nvml.Return) { return sg.index, nvml.SUCCESS },
		GetPciInfoFunc:     func() (nvml.PciInfo, nvml.Return) { return sg.bus.pciInfo(), nvml.SUCCESS },
		GetBrandFunc:       func() (nvml.BrandType, nvml.Return) { return brand, nvml.SUCCESS },
		GetArchitectureFunc: func() (nvml.DeviceArchitecture, nvml.Return) {
			return arch, nvml.SUCCESS
		},
		GetCudaComputeCapabilityFunc: func() (int, int, nvml.Return) {
			return spec.ComputeCapability.Major, spec.ComputeCapability.Minor, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: spec.MemoryBytes(), Free: spec.MemoryBytes()}, nvml.SUCCESS
		},
		GetMemoryBusWidthFunc: func() (uint32, nvml.Return) {
			return uint32(spec.MemoryBusWidthBits), nvml.SUCCESS
		},
		GetMaxClockInfoFunc: func(t nvml.ClockType) (uint32, nvml.Return) {
			switch t {
			case nvml.CLOCK_MEM:
				return uint32(spec.MaxMemoryClockMHz), nvml.SUCCESS
			case nvml.CLOCK_SM, nvml.CLOCK_GRAPHICS:
				return uint32(spec.MaxSMClockMHz), nvml.SUCCESS
			}
			return 0, nvml.ERROR_NOT_SUPPORTED
		},
		GetAttributesFunc: func() (nvml.DeviceAttributes, nvml.Return) {
			return nvml.DeviceAttributes{MultiprocessorCount: uint32(spec.MultiprocessorCount)}, nvml.SUCCESS
		},
		GetMaxPcieLinkGenerationFunc: func() (int, nvml.Return) { return spec.PCIeGeneration, nvml.SUCCESS },
		GetMaxPcieLinkWidthFunc:      func() (int, nvml.Return) { return spec.PCIeLinkWidth, nvml.SUCCESS },
		GetNumaNodeIdFunc: func() (int, nvml.Return) {
			if sg.numaNode < 0 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			return sg.numaNode, nvml.SUCCESS
		},
		GetMigModeFunc: func() (int, int, nvml.Return) {
			if !spec.MIGCapable {
				return 0, 0, nvml.ERROR_NOT_SUPPORTED
			}
			if sg.mig != nil {
				return nvml.DEVICE_MIG_ENABLE, nvml.DEVICE_MIG_ENABLE, nvml.SUCCESS
			}
			return nvml.DEVICE_MIG_DISABLE, nvml.DEVICE_MIG_DISABLE, nvml.SUCCESS
		},
		GetNvLinkStateFunc: func(link int) (nvml.EnableState, nvml.Return) {
			if spec.NVLinks == 0 {
				return 0, nvml.ERROR_NOT_SUPPORTED
			}
			if link < 0 || link >= spec.NVLinks {
				return 0, nvml.ERROR_INVALID_ARGUMENT
			}
			if link >= len(sg.nvlinkTo) {
				return nvml.FEATURE_DISABLED, nvml.SUCCESS
			}
			return nvml.FEATURE_ENABLED, nvml.SUCCESS
		},
		GetNvLinkRemotePciInfoFunc: func(link int) (nvml.PciInfo, nvml.Return) {
			if link < 0 || link >= len(sg.nvlinkTo) {
				return nvml.PciInfo{}, nvml.ERROR_INVALID_ARGUMENT
			}
			return sg.nvlinkTo[link].pciInfo(), nvml.SUCCESS
		},
		GetGpuInstanceProfileInfoFunc:        profileInfo,
		GetGpuInstancePossiblePlacementsFunc: possiblePlacements,
	}
}
