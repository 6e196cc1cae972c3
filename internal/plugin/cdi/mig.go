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

package cdi

import (
	"fmt"
	"os"
	"path/filepath"

	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// MIGDevice names the GPU and compute instance of a MIG device. A
// container reaches them through the parent's /dev/nvidiaN and the
// nvidia-caps nodes that grant access to the two instances.
type MIGDevice struct {
	GPUInstance, ComputeInstance int
}

// Minor numbers of /dev/nvidia-caps/nvidia-cap<N>, as the driver lays them
// out in /proc/driver/nvidia-caps/mig-minors: 1 and 2 are config and
// monitor, then each GPU has 15 GPU instances of 9 minors each, the
// instance's access and its 8 compute instances'.
const (
	capsFirstMinor     = 3
	capsPerGPUInstance = 9
	capsGPUInstances   = 15
	capsComputePerGI   = 8
	capsDir            = "nvidia-caps"
)

func capMinors(gpuMinor int, m MIGDevice) (gi, ci int) {
	gi = capsFirstMinor + gpuMinor*capsGPUInstances*capsPerGPUInstance + m.GPUInstance*capsPerGPUInstance
	return gi, gi + 1 + m.ComputeInstance
}

// MakeFakeMIGCaps adds to a fake driver root the nvidia-caps nodes of every
// GPU and compute instance the given GPU minors may have.
func MakeFakeMIGCaps(dir string, minors []int) error {
	if err := os.MkdirAll(filepath.Join(dir, "dev", capsDir), 0o755); err != nil {
		return fmt.Errorf("creating fake MIG caps: %w", err)
	}
	for _, g := range minors {
		for gi := range capsGPUInstances {
			for ci := -1; ci < capsComputePerGI; ci++ {
				giMinor, ciMinor := capMinors(g, MIGDevice{GPUInstance: gi, ComputeInstance: ci})
				n := ciMinor
				if ci < 0 {
					n = giMinor
				}
				if err := os.WriteFile(filepath.Join(dir, "dev", capsDir, fmt.Sprintf("nvidia-cap%d", n)), nil, 0o644); err != nil {
					return fmt.Errorf("creating fake MIG caps: %w", err)
				}
			}
		}
	}
	return nil
}

// migEdits are the nvidia-caps nodes of a simulated MIG device.
func (s *simulatedSource) migEdits(d Device) (*cdispec.ContainerEdits, error) {
	if d.MIG.GPUInstance < 0 || d.MIG.GPUInstance >= capsGPUInstances || d.MIG.ComputeInstance < 0 || d.MIG.ComputeInstance >= capsComputePerGI {
		return nil, fmt.Errorf("MIG device of GPU instance %d, compute instance %d is out of the driver's range", d.MIG.GPUInstance, d.MIG.ComputeInstance)
	}
	edits := &cdispec.ContainerEdits{}
	gi, ci := capMinors(d.Minor, *d.MIG)
	for _, minor := range []int{gi, ci} {
		node, err := s.deviceNode(fmt.Sprintf("%s/nvidia-cap%d", capsDir, minor), capsMajor, int64(minor))
		if err != nil {
			return nil, err
		}
		edits.DeviceNodes = append(edits.DeviceNodes, node)
	}
	return edits, nil
}

// capsMajor stands for the dynamic major of nvidia-caps on a simulated
// node, as simulatedUVMMajor does for nvidia-uvm.
const capsMajor = 510
