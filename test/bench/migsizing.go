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

package bench

import (
	"context"
	"fmt"
	"io"
	"path/filepath"

	"github.com/prismgpu/prism/internal/sim"
)

// MIGSizingGPU is the GPU model of the shipped slice speeds (MISO's).
const MIGSizingGPU = "a100-40gb"

// MIGSizingSweep is the grid `make bench` runs: every sizing policy, four
// loads, four noise levels for the policies that read measured figures,
// ten seeds.
func MIGSizingSweep() sim.SliceSweep {
	return sim.SliceSweep{Policies: sim.SlicePolicies, Loads: []float64{0.3, 0.5, 0.7, 0.9}, Noises: []float64{0, 0.1, 0.2, 0.4},
		Seeds: 10, GPUs: 32, Jobs: 2000, Workers: 2, WithGPUsNeeded: true}
}

// MIGSizing runs the MIG sizing evaluation on the slice speeds shipped in
// test/bench/data (pure computation, no test bed), writes its report to w
// and returns one row per load: prism's goodput per busy GPU and GPUs
// needed against whole-GPU allocation and against the oracle.
func MIGSizing(ctx context.Context, repo string, w io.Writer) ([]Row, error) {
	dir := filepath.Join(repo, "test", "bench", "data")
	m, err := sim.ReadMeasured(filepath.Join(dir, "jobs.csv"), "", filepath.Join(dir, "slices.csv"))
	if err != nil {
		return nil, err
	}
	d, err := m.ForSlicing(MIGSizingGPU)
	if err != nil {
		return nil, err
	}
	s := MIGSizingSweep()
	outs, err := d.Execute(ctx, s)
	if err != nil {
		return nil, err
	}
	table := sim.SummariseSlicing(outs)
	if err := sim.WriteSlicingReport(w, d, s, table); err != nil {
		return nil, err
	}
	return migSizingRows(table), nil
}

func migSizingRows(table []*sim.SliceRow) []Row {
	var rows []Row
	for _, r := range table {
		if r.Policy != sim.SlicePrism || r.Noise != 0 {
			continue
		}
		cse := fmt.Sprintf("%s, load %.0f%%", MIGSizingGPU, 100*r.Load)
		note := fmt.Sprintf("prism median slowdown %.2fx, <80%%: %.1f%%", r.Median.Mean, 100*r.Below80.Mean)
		for _, base := range []sim.SlicePolicy{sim.SliceWhole, sim.SliceOracle} {
			b := sim.RowAt(table, base, r.Load, 0)
			if b == nil {
				continue
			}
			rows = append(rows, NewRow("mig-sizing", cse, "goodput per busy GPU", "x whole GPU", string(base), b.Goodput.Mean, "prism", r.Goodput.Mean, note))
			if b.GPUsNeeded.N > 0 && r.GPUsNeeded.N > 0 {
				rows = append(rows, NewRow("mig-sizing", cse, "GPUs needed (<= 10% of jobs beyond 2x)", "GPUs", string(base), b.GPUsNeeded.Mean, "prism", r.GPUsNeeded.Mean, note))
			}
		}
	}
	return rows
}
