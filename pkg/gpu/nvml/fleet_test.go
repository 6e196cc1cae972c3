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
	"path/filepath"
	"strings"
	"testing"
)

func TestLoadFleetRejectsInvalidFiles(t *testing.T) {
	for file, wantErrs := range map[string][]string{
		"unknown-product.yaml": {
			`gpus[0].product: Unsupported value: "NVIDIA H100"`,
			// The message lists what would have been accepted.
			`"NVIDIA H100 80GB HBM3"`, `"Tesla T4"`,
		},
		"unknown-field.yaml":          {`unknown field "nvlinks"`},
		"nvlink-on-pcie-only.yaml":    {"gpus[0].nvlink: Invalid value: true: NVIDIA L4 has no NVLink"},
		"island-does-not-divide.yaml": {"gpus[0].nvlinkIslandSize: Invalid value: 4: must divide count (6)"},
		"too-many-gpus.yaml":          {"gpus: Too many: 17: must have at most 16 items"},
		"missing-versions.yaml":       {"driverVersion: Required value", "cudaDriverVersion: Required value"},
		"bad-versions.yaml":           {`driverVersion: Invalid value: "r550"`, "cudaDriverVersion: Invalid value: 124"},
		"no-gpus.yaml":                {"gpus: Required value"},
		"bad-counts.yaml":             {"gpus[0].count: Invalid value: 0", "gpus[1].numaNodes: Invalid value: 3"},
		"not-yaml.yaml":               {"decoding fleet"},
	} {
		t.Run(file, func(t *testing.T) {
			path := filepath.Join("testdata", "invalid", file)
			f, err := LoadFleet(path)
			if err == nil {
				t.Fatalf("LoadFleet accepted %s: %+v", path, f)
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the file", err)
			}
			for _, want := range wantErrs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

func TestLoadFleetMissingFile(t *testing.T) {
	if _, err := LoadFleet(filepath.Join(t.TempDir(), "absent.yaml")); err == nil || !strings.Contains(err.Error(), "reading fleet file") {
		t.Errorf("LoadFleet of a missing file: err = %v", err)
	}
}

func TestParseFleetAcceptsJSON(t *testing.T) {
	f, err := ParseFleet([]byte(`{"driverVersion": "550.54.15", "cudaDriverVersion": 12040,
		"gpus": [{"product": "NVIDIA H100 80GB HBM3", "count": 8, "nvlink": true, "numaNodes": 2}]}`))
	if err != nil {
		t.Fatalf("ParseFleet: %v", err)
	}
	if len(f.GPUs) != 1 || f.GPUs[0].Count != 8 || !f.GPUs[0].NVLink || f.GPUs[0].NUMANodes != 2 {
		t.Errorf("ParseFleet = %+v", f)
	}
}

// The shipped demo fleets are documentation; they must stay loadable.
func TestDemoFleets(t *testing.T) {
	for file, wantGPUs := range map[string]int{
		"h100-sxm-8.yaml":  8,
		"a100-40gb-8.yaml": 8,
		"l4-4.yaml":        4,
		"t4-2.yaml":        2,
		"mixed.yaml":       8,
	} {
		t.Run(file, func(t *testing.T) {
			f, err := LoadFleet(filepath.Join("..", "..", "..", "demo", "fleets", file))
			if err != nil {
				t.Fatalf("LoadFleet: %v", err)
			}
			total := 0
			for _, g := range f.GPUs {
				total += g.Count
			}
			if total != wantGPUs {
				t.Errorf("fleet has %d GPUs, want %d", total, wantGPUs)
			}
		})
	}
}
