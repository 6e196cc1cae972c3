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

// PackingGPUs are the GPU models of the shipped data whose pairs were
// measured: Gavel's (its K80 shows no gain from sharing for any policy and
// is left to `prismctl simulate --gpu k80`) and the H100 pairs of
// hack/gpu-check.sh, time-sliced and under MPS.
var PackingGPUs = []string{"v100", "p100", "h100", "h100-mps"}

// PackingSweep is the grid `make bench` runs: every policy, four loads,
// four noise levels for prism, ten seeds.
func PackingSweep() sim.PackSweep {
	return sim.PackSweep{Policies: sim.PackPolicies, Loads: []float64{0.3, 0.5, 0.7, 0.9}, Noises: []float64{0, 0.1, 0.2, 0.4},
		Seeds: 10, GPUs: 32, Jobs: 2000, Workers: 2, WithGPUsNeeded: true}
}

// Packing runs the packing evaluation on the measured data shipped in
// test/bench/data (pure computation, no test bed), writes its report to w
// and returns one row per GPU model and load: prism's goodput per GPU
// against whole-GPU allocation and against the best profile-free policy
// that meets the interference target.
func Packing(ctx context.Context, repo string, w io.Writer) ([]Row, error) {
	dir := filepath.Join(repo, "test", "bench", "data")
	m, err := sim.ReadMeasured(filepath.Join(dir, "jobs.csv"), filepath.Join(dir, "pairs.csv"), filepath.Join(dir, "slices.csv"))
	if err != nil {
		return nil, err
	}
	s := PackingSweep()
	var rows []Row
	for _, gpu := range PackingGPUs {
		d, err := m.ForGPU(gpu, sim.GPUMemoryMiB[gpu])
		if err != nil {
			return rows, err
		}
		outs, err := d.Execute(ctx, s)
		if err != nil {
			return rows, err
		}
		table := sim.SummarisePacking(outs)
		if err := sim.WritePackingReport(w, d, s, table); err != nil {
			return rows, err
		}
		fmt.Fprintln(w)
		rows = append(rows, packingRows(gpu, table)...)
	}
	return rows, nil
}

func packingRows(gpu string, table []*sim.PackRow) []Row {
	var rows []Row
	for _, r := range table {
		if r.Policy != sim.PackPrism || r.Noise != 0 {
			continue
		}
		cse := fmt.Sprintf("%s, load %.0f%%", gpu, 100*r.Load)
		note := fmt.Sprintf("prism <80%%: %.1f%%", 100*r.Below80.Mean)
		if whole := sim.RowAt(table, sim.PackWhole, r.Load, 0); whole != nil {
			rows = append(rows, NewRow("packing", cse, "goodput per busy GPU", "x alone", "whole-gpu", whole.Goodput.Mean, "prism", r.Goodput.Mean, note))
		}
		if oracle := sim.RowAt(table, sim.PackOracle, r.Load, 0); oracle != nil {
			rows = append(rows, NewRow("packing", cse, "goodput per busy GPU, oracle bound", "x alone", "oracle", oracle.Goodput.Mean, "prism", r.Goodput.Mean, note))
		}
	}
	return rows
}
