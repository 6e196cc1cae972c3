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

package simulatecmd

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prismgpu/prism/internal/sim"
)

// runSlicing runs the MIG sizing evaluation on every GPU model of
// slices.csv with a MIG model. Alongside packing (--pairs), a slices file
// with no such model is summarised and skipped; alone, it is an error.
func runSlicing(cmd *cobra.Command, f packFlags, m *sim.Measured) error {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	var gpus, unmodelled []string
	for _, s := range m.Slices {
		_, ok := sim.MIGModels[s.GPU]
		switch {
		case ok && !slices.Contains(gpus, s.GPU):
			gpus = append(gpus, s.GPU)
		case !ok && !slices.Contains(unmodelled, s.GPU):
			unmodelled = append(unmodelled, s.GPU)
		}
	}
	if len(unmodelled) > 0 {
		fmt.Fprintf(out, "MIG sizing: no MIG model for %s (models: %s); not evaluated.\n", strings.Join(unmodelled, ", "), strings.Join(sim.SlicingGPUs(), ", "))
	}
	if len(gpus) == 0 {
		if f.pairs != "" {
			return nil
		}
		return fmt.Errorf("%s: no GPU model with a MIG model (models: %s)", f.slices, strings.Join(sim.SlicingGPUs(), ", "))
	}
	s := sim.SliceSweep{Seeds: f.seeds, GPUs: f.gpus, Jobs: f.jobsPerRun, Workers: f.workers, WithGPUsNeeded: f.gpusNeeded}
	// Alongside --pairs, --policies names packing policies.
	policies := f.policies
	if f.pairs != "" {
		policies = ""
	}
	var err error
	if s.Policies, s.Loads, s.Noises, err = sweepAxes(policies, sim.SlicePolicies, f.loads, f.noise, sim.ParseSlicePolicy); err != nil {
		return err
	}
	for _, gpu := range gpus {
		d, err := m.ForSlicing(gpu)
		if err != nil {
			return err
		}
		report := func(rows []*sim.SliceRow) error { return sim.WriteSlicingReport(out, d, s, rows) }
		err = evaluate(out, f.svgDir, func() ([]sim.SliceOutcome, error) { return d.Execute(ctx, s) }, sim.SummariseSlicing, report,
			sim.SliceMetrics, func(rows []*sim.SliceRow, metric sim.SliceMetric) (string, func(io.Writer) error) {
				title := fmt.Sprintf("MIG sizing on %s, %s (%d seeds, 95%% CI)", gpu, metric.Name, s.Seeds)
				return "mig-sizing-" + gpu + "-" + metric.Name + ".svg", func(w io.Writer) error { return sim.WriteSlicingSVG(w, title, rows, metric) }
			})
		if err != nil {
			return err
		}
	}
	return nil
}
