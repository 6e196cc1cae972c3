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
	"time"

	"github.com/spf13/cobra"

	"github.com/prismgpu/prism/internal/sim"
)

// packFlags are the packing evaluation's flags; loads, noise, seeds,
// workers and svg are shared with the trace sweep.
type packFlags struct {
	jobs, pairs, slices, gpu, policies, loads, noise, svgDir string
	gpuMemMiB                                                float64
	gpus, jobsPerRun, seeds, workers                         int
	gpusNeeded, skipIncomplete                               bool
}

// runMeasured runs the evaluations on measured data the flags name: the
// packing evaluation with --pairs, the MIG sizing evaluation with --slices,
// both with both.
func runMeasured(cmd *cobra.Command, f packFlags) error {
	if f.jobs == "" || (f.pairs == "" && f.slices == "") {
		return fmt.Errorf("--jobs needs --pairs (the packing evaluation), --slices (the MIG sizing evaluation) or both")
	}
	if f.gpus < 1 || f.jobsPerRun < 10 || f.seeds < 1 || f.workers < 1 {
		return fmt.Errorf("--gpus, --seeds and --workers must be at least 1 and --stream at least 10")
	}
	m, err := sim.ReadMeasured(f.jobs, f.pairs, f.slices)
	if err != nil {
		return err
	}
	if f.pairs != "" {
		if err := runPacking(cmd, f, m); err != nil {
			return err
		}
	}
	if f.slices != "" {
		return runSlicing(cmd, f, m)
	}
	return nil
}

func runPacking(cmd *cobra.Command, f packFlags, m *sim.Measured) error {
	ctx, out := cmd.Context(), cmd.OutOrStdout()
	s := sim.PackSweep{Seeds: f.seeds, GPUs: f.gpus, Jobs: f.jobsPerRun, Workers: f.workers, WithGPUsNeeded: f.gpusNeeded}
	var err error
	if s.Policies, s.Loads, s.Noises, err = sweepAxes(f.policies, sim.PackPolicies, f.loads, f.noise, sim.ParsePackPolicy); err != nil {
		return err
	}
	mem := f.gpuMemMiB
	if mem == 0 {
		mem = sim.GPUMemoryMiB[f.gpu]
	}
	forGPU := m.ForGPU
	if f.skipIncomplete {
		forGPU = m.ForGPUSkipIncomplete
	}
	d, err := forGPU(f.gpu, mem)
	if err != nil {
		return err
	}
	if f.slices != "" {
		fmt.Fprintln(out, slicesSummary(m.Slices))
	}
	report := func(rows []*sim.PackRow) error { return sim.WritePackingReport(out, d, s, rows) }
	return evaluate(out, f.svgDir, func() ([]sim.PackOutcome, error) { return d.Execute(ctx, s) }, sim.SummarisePacking, report,
		sim.PackMetrics, func(rows []*sim.PackRow, metric sim.PackMetric) (string, func(io.Writer) error) {
			title := fmt.Sprintf("Packing on %s, %s (%d seeds, 95%% CI)", d.GPU, metric.Name, s.Seeds)
			return "packing-" + metric.Name + ".svg", func(w io.Writer) error { return sim.WritePackingSVG(w, title, rows, metric) }
		})
}

// evaluate runs a packing or sizing sweep, prints its report and how many
// runs took how long, and, where svgDir names a directory, writes a plot
// of each metric there.
func evaluate[Out, Row, Metric any](out io.Writer, svgDir string, execute func() ([]Out, error), summarise func([]Out) []Row,
	report func([]Row) error, metrics []Metric, plot func([]Row, Metric) (name string, draw func(io.Writer) error)) error {
	start := time.Now()
	outs, err := execute()
	if err != nil {
		return err
	}
	rows := summarise(outs)
	if err := report(rows); err != nil {
		return err
	}
	fmt.Fprintf(out, "%d runs in %s.\n", len(outs), time.Since(start).Round(time.Millisecond))
	if svgDir == "" {
		return nil
	}
	return writePlots(out, svgDir, metrics, func(m Metric) (string, func(io.Writer) error) { return plot(rows, m) })
}

func slicesSummary(ss []sim.SliceSpeed) string {
	var jobs, gpus, profiles []string
	var didNotFit, notMeasured int
	for _, s := range ss {
		switch {
		case !sim.Known(s.Speed):
			notMeasured++
		case s.Speed == 0:
			didNotFit++
		}
		for _, x := range []struct {
			list *[]string
			v    string
		}{{&jobs, s.Job + "@" + s.GPU}, {&gpus, s.GPU}, {&profiles, s.Slice}} {
			if !slices.Contains(*x.list, x.v) {
				*x.list = append(*x.list, x.v)
			}
		}
	}
	return fmt.Sprintf("Slices: %d speeds, %d did not fit and %d not measured (empty), of %d job types on %s, slices %s (not used by packing; the MIG sizing evaluation reads them).",
		len(ss)-didNotFit-notMeasured, didNotFit, notMeasured, len(jobs), strings.Join(gpus, ", "), strings.Join(profiles, ", "))
}
