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
	"fmt"
	"os"
	"regexp"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/pkg/gpu"
)

// MaxFleetGPUs bounds a simulated node. Real nodes top out around 16 GPUs,
// and the simulated PCI layout is only guaranteed unique up to this many.
const MaxFleetGPUs = 16

// Fleet describes the GPUs of one simulated node. It is read from YAML or
// JSON, for example:
//
//	driverVersion: "550.54.15"
//	cudaDriverVersion: 12040
//	gpus:
//	- product: NVIDIA H100 80GB HBM3
//	  count: 8
//	  numaNodes: 2
//	  nvlink: true
type Fleet struct {
	// DriverVersion is what nvmlSystemGetDriverVersion reports.
	DriverVersion string `json:"driverVersion"`
	// CUDADriverVersion is what nvmlSystemGetCudaDriverVersion reports:
	// major*1000 + minor*10, so 12040 is CUDA 12.4.
	CUDADriverVersion int `json:"cudaDriverVersion"`
	// GPUs are listed in index order: the first group gets the lowest
	// indices.
	GPUs []GPUGroup `json:"gpus"`
	// UsageFile is a JSON file of what workloads use on the GPUs (see
	// Usage), read on every NVML call; empty or missing, the GPUs are idle.
	UsageFile string `json:"usageFile,omitempty"`
	// MIGRecordFile holds the GPU and compute instances of the GPUs in MIG
	// mode (see MIGRecord): every create and destroy is appended to it, and
	// it is replayed on every call, so that instances outlive the plugin
	// process and another process can check them. Empty, they live in
	// memory only.
	MIGRecordFile string `json:"migRecordFile,omitempty"`
}

// GPUGroup is a run of identical GPUs.
type GPUGroup struct {
	// Product is a name from the built-in spec table, exactly as NVML
	// reports it (e.g. "NVIDIA H100 80GB HBM3").
	Product string `json:"product"`
	Count   int    `json:"count"`
	// NUMANodes spreads the group evenly over NUMA nodes 0..NUMANodes-1
	// in index order. Zero means the platform reports no NUMA affinity.
	NUMANodes int `json:"numaNodes,omitempty"`
	// NVLink connects the group's GPUs. The product must have NVLink.
	NVLink bool `json:"nvlink,omitempty"`
	// NVLinkIslandSize splits the group into NVLink islands of this many
	// consecutive GPUs; zero means one island for the whole group. An
	// island of two is wired with a direct bridge, larger islands through
	// NVSwitches, as on real boards.
	NVLinkIslandSize int `json:"nvlinkIslandSize,omitempty"`
	// MIGMode simulates the group's GPUs with MIG mode enabled, answering
	// NVML's profile and placement calls as the real board does. The
	// product must be one of SimulatedMIGProducts.
	MIGMode bool `json:"migMode,omitempty"`
}

// LoadFleet reads and validates a fleet file.
func LoadFleet(path string) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading fleet file: %w", err)
	}
	f, err := ParseFleet(data)
	if err != nil {
		return nil, fmt.Errorf("fleet file %s: %w", path, err)
	}
	return f, nil
}

// ParseFleet decodes YAML or JSON strictly, so that a typo in a field name
// is an error instead of a silently different node, and validates it.
func ParseFleet(data []byte) (*Fleet, error) {
	var f Fleet
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("decoding fleet: %w", err)
	}
	if err := f.Validate(); err != nil {
		return nil, err
	}
	return &f, nil
}

var dottedVersion = regexp.MustCompile(`^[0-9]+(\.[0-9]+){1,3}$`)

// Validate reports every problem at once, each with the path of the field.
func (f *Fleet) Validate() error {
	var errs field.ErrorList
	if f.DriverVersion == "" {
		errs = append(errs, field.Required(field.NewPath("driverVersion"), `e.g. "550.54.15"`))
	} else if !dottedVersion.MatchString(f.DriverVersion) {
		errs = append(errs, field.Invalid(field.NewPath("driverVersion"), f.DriverVersion, `must be a dotted driver version such as "550.54.15"`))
	}
	if f.CUDADriverVersion == 0 {
		errs = append(errs, field.Required(field.NewPath("cudaDriverVersion"), "e.g. 12040 for CUDA 12.4"))
	} else if f.CUDADriverVersion < 1000 || f.CUDADriverVersion%10 != 0 {
		errs = append(errs, field.Invalid(field.NewPath("cudaDriverVersion"), f.CUDADriverVersion, "must be major*1000 + minor*10, e.g. 12040 for CUDA 12.4"))
	}

	gpusPath := field.NewPath("gpus")
	if len(f.GPUs) == 0 {
		errs = append(errs, field.Required(gpusPath, "a node needs at least one GPU"))
	}
	total := 0
	for i, g := range f.GPUs {
		p := gpusPath.Index(i)
		total += max(g.Count, 0)
		spec, known := gpu.LookupSpec(g.Product)
		switch {
		case g.Product == "":
			errs = append(errs, field.Required(p.Child("product"), ""))
		case !known:
			errs = append(errs, field.NotSupported(p.Child("product"), g.Product, gpu.Products()))
		}
		if g.Count < 1 {
			errs = append(errs, field.Invalid(p.Child("count"), g.Count, "must be at least 1"))
		}
		if g.NUMANodes < 0 || (g.Count > 0 && g.NUMANodes > g.Count) {
			errs = append(errs, field.Invalid(p.Child("numaNodes"), g.NUMANodes, "must be between 0 and count"))
		}
		if g.NVLink && known && spec.NVLinks == 0 {
			errs = append(errs, field.Invalid(p.Child("nvlink"), g.NVLink, fmt.Sprintf("%s has no NVLink", g.Product)))
		}
		if _, ok := simulatedMIGProfiles[g.Product]; g.MIGMode && known && !ok {
			errs = append(errs, field.Invalid(p.Child("migMode"), g.MIGMode, fmt.Sprintf("the simulator knows the MIG profiles of %v only", SimulatedMIGProducts())))
		}
		if g.NVLinkIslandSize != 0 {
			switch {
			case !g.NVLink:
				errs = append(errs, field.Invalid(p.Child("nvlinkIslandSize"), g.NVLinkIslandSize, "requires nvlink: true"))
			case g.NVLinkIslandSize < 2:
				errs = append(errs, field.Invalid(p.Child("nvlinkIslandSize"), g.NVLinkIslandSize, "an island needs at least 2 GPUs"))
			case g.Count > 0 && g.Count%g.NVLinkIslandSize != 0:
				errs = append(errs, field.Invalid(p.Child("nvlinkIslandSize"), g.NVLinkIslandSize, fmt.Sprintf("must divide count (%d)", g.Count)))
			}
		}
	}
	if total > MaxFleetGPUs {
		errs = append(errs, field.TooMany(gpusPath, total, MaxFleetGPUs))
	}
	return errs.ToAggregate()
}
