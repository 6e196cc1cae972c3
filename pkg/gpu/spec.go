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

package gpu

import (
	_ "embed"
	"encoding/csv"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Spec holds what a product's public datasheet says about it, plus the
// figures NVML would report for it. Discovery falls back to a Spec when
// NVML cannot answer, and the simulated backend serves a Spec through NVML
// calls, so both paths go through the same formulas.
type Spec struct {
	// Product is the name exactly as nvmlDeviceGetName returns it.
	Product           string
	Architecture      string
	Brand             string
	ComputeCapability ComputeCapability

	// Datasheet figures (dense, no sparsity). MemoryGB is the marketing
	// size ("80GB").
	MemoryGB            int
	MemoryType          string
	BandwidthGBps       int
	FP32TFLOPS          float64
	FP16TensorTFLOPS    int
	MultiprocessorCount int

	// NVML-style figures. The clocks are picked so that MemoryBandwidthGBps
	// and FP32GFLOPS reproduce the datasheet, because a datasheet quotes
	// results and NVML reports inputs.
	MemoryBusWidthBits int
	MaxMemoryClockMHz  int
	MaxSMClockMHz      int
	PCIeGeneration     int
	PCIeLinkWidth      int
	// NVLinks is the number of NVLink links the product has; zero means
	// the product cannot join an NVLink domain.
	NVLinks    int
	MIGCapable bool
	// MemoryMiB is the framebuffer size nvmlDeviceGetMemoryInfo reports
	// on a real board, which is less than the marketing size because
	// the driver reserves some of it. It is set only for the products
	// where it was measured; zero means unmeasured.
	MemoryMiB uint64
}

// MemoryBytes is the framebuffer size the simulated backend reports, and
// discovery's fallback when NVML cannot answer: MemoryMiB where it was
// measured, else MemoryGB taken as GiB. Unmeasured products therefore
// report their marketing size, a little more than a real board does.
func (s Spec) MemoryBytes() uint64 {
	if s.MemoryMiB > 0 {
		return s.MemoryMiB << 20
	}
	return uint64(s.MemoryGB) << 30
}

// specsCSV is the built-in spec table. It is data rather than Go so that
// a product is one row to review; parseSpecs checks it when the package
// loads, and a malformed table fails every test of the package.
//
//go:embed specs.csv
var specsCSV string

var specs = mustParseSpecs(specsCSV)

// specColumns are the table's columns in order, each with where its value
// goes. Every column must be present and every value must parse.
var specColumns = []struct {
	name string
	set  func(*Spec, string) error
}{
	{"product", setString(func(s *Spec) *string { return &s.Product })},
	{"architecture", setString(func(s *Spec) *string { return &s.Architecture })},
	{"brand", setString(func(s *Spec) *string { return &s.Brand })},
	{"compute_capability", func(s *Spec, v string) error {
		major, minor, ok := strings.Cut(v, ".")
		if !ok {
			return fmt.Errorf("want major.minor")
		}
		var err error
		if s.ComputeCapability.Major, err = strconv.Atoi(major); err != nil {
			return err
		}
		s.ComputeCapability.Minor, err = strconv.Atoi(minor)
		return err
	}},
	{"memory_gb", setInt(func(s *Spec) *int { return &s.MemoryGB }, required)},
	{"memory_type", setString(func(s *Spec) *string { return &s.MemoryType })},
	{"bandwidth_gbps", setInt(func(s *Spec) *int { return &s.BandwidthGBps }, required)},
	{"fp32_tflops", func(s *Spec, v string) (err error) {
		if s.FP32TFLOPS, err = strconv.ParseFloat(v, 64); err == nil && s.FP32TFLOPS <= 0 {
			err = fmt.Errorf("must be positive")
		}
		return err
	}},
	{"fp16_tensor_tflops", setInt(func(s *Spec) *int { return &s.FP16TensorTFLOPS }, zeroOK)},
	{"sms", setInt(func(s *Spec) *int { return &s.MultiprocessorCount }, required)},
	{"memory_bus_width_bits", setInt(func(s *Spec) *int { return &s.MemoryBusWidthBits }, required)},
	{"max_memory_clock_mhz", setInt(func(s *Spec) *int { return &s.MaxMemoryClockMHz }, required)},
	{"max_sm_clock_mhz", setInt(func(s *Spec) *int { return &s.MaxSMClockMHz }, required)},
	{"pcie_generation", setInt(func(s *Spec) *int { return &s.PCIeGeneration }, required)},
	{"pcie_link_width", setInt(func(s *Spec) *int { return &s.PCIeLinkWidth }, required)},
	{"nvlinks", setInt(func(s *Spec) *int { return &s.NVLinks }, zeroOK)},
	{"mig_capable", func(s *Spec, v string) (err error) {
		s.MIGCapable, err = strconv.ParseBool(v)
		return err
	}},
	{"memory_mib", func(s *Spec, v string) (err error) {
		s.MemoryMiB, err = strconv.ParseUint(v, 10, 64)
		return err
	}},
}

func setString(field func(*Spec) *string) func(*Spec, string) error {
	return func(s *Spec, v string) error {
		if v == "" {
			return fmt.Errorf("empty")
		}
		*field(s) = v
		return nil
	}
}

// Zero stands for "none" in a few columns (no FP16 tensor figure, no
// NVLink); elsewhere the formulas built on a figure would publish a GPU
// with no bandwidth or no FLOPS, so the figure is required.
const (
	required = false
	zeroOK   = true
)

func setInt(field func(*Spec) *int, zero bool) func(*Spec, string) error {
	return func(s *Spec, v string) error {
		n, err := strconv.Atoi(v)
		switch {
		case err != nil:
			return err
		case n < 0 || n == 0 && !zero:
			return fmt.Errorf("must be positive")
		}
		*field(s) = n
		return nil
	}
}

func mustParseSpecs(table string) []Spec {
	specs, err := parseSpecs(table)
	if err != nil {
		panic(fmt.Sprintf("gpu: built-in spec table: %v", err))
	}
	return specs
}

// parseSpecs reads the spec table: a header row naming specColumns in
// order, then a product a row. Lines starting with # are comments.
func parseSpecs(table string) ([]Spec, error) {
	r := csv.NewReader(strings.NewReader(table))
	r.Comment = '#'
	r.TrimLeadingSpace = true
	r.FieldsPerRecord = len(specColumns)
	rows, err := r.ReadAll()
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no header")
	}
	for i, c := range specColumns {
		if rows[0][i] != c.name {
			return nil, fmt.Errorf("column %d is %q, want %q", i+1, rows[0][i], c.name)
		}
	}
	out := make([]Spec, 0, len(rows)-1)
	seen := map[string]bool{}
	for _, row := range rows[1:] {
		var s Spec
		for i, c := range specColumns {
			if err := c.set(&s, row[i]); err != nil {
				return nil, fmt.Errorf("%s: %s %q: %w", row[0], c.name, row[i], err)
			}
		}
		if seen[s.Product] {
			return nil, fmt.Errorf("%s: listed twice", s.Product)
		}
		seen[s.Product] = true
		out = append(out, s)
	}
	return out, nil
}

var specsByProduct = func() map[string]Spec {
	m := make(map[string]Spec, len(specs))
	for _, s := range specs {
		m[s.Product] = s
	}
	return m
}()

// LookupSpec returns the built-in spec of a product, keyed by the name NVML
// reports for it.
func LookupSpec(product string) (Spec, bool) {
	s, ok := specsByProduct[product]
	return s, ok
}

// Products lists the products in the built-in spec table, sorted.
func Products() []string {
	return slices.Sorted(maps.Keys(specsByProduct))
}
