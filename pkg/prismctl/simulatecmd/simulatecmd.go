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

// Package simulatecmd implements `prismctl simulate`: replay a job trace
// against a simulated fleet with and without profile-aware rewriting.
package simulatecmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prismgpu/prism/pkg/sim"
)

// NewCommand returns the `simulate` command with its `generate` subcommand.
func NewCommand() *cobra.Command {
	var (
		fleetPath, tracePath, format, mixFlag, modesFlag, svgPath, jsonPath string
		seed                                                                uint64
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Replay a job trace on a simulated fleet: plain claims against profile-aware rewrites",
		Long: `Replays a job trace on a simulated fleet once per mode: blind (plain claims,
any free GPU), performance and economy (claims rewritten from each job's
profile by the admission controller's code). Every placement is decided by
Kubernetes' structured allocator against the ResourceSlices Prism's kubelet
plugin publishes. Runtimes in the trace are on an ` + sim.ReferenceProduct + `;
see docs/simulator.md for the speed model.

Native trace: arrival_s,gpus,runtime_s,bound_type[,sm_pct,mem_pct].
Alibaba trace (cluster-trace-gpu-v2023 pod list): bound types are drawn
from --bound-mix with --seed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			if fleetPath == "" || tracePath == "" {
				return fmt.Errorf("--fleet and --trace are required")
			}
			var modes []sim.Mode
			for m := range strings.SplitSeq(modesFlag, ",") {
				mode, err := sim.ParseMode(strings.TrimSpace(m))
				if err != nil {
					return err
				}
				modes = append(modes, mode)
			}
			fc, err := sim.LoadFleetConfig(fleetPath)
			if err != nil {
				return err
			}
			cl, err := sim.BuildCluster(ctx, fc)
			if err != nil {
				return err
			}
			f, err := os.Open(tracePath)
			if err != nil {
				return err
			}
			defer f.Close()
			var jobs []*sim.Job
			switch format {
			case "native":
				if cmd.Flags().Changed("bound-mix") {
					return fmt.Errorf("--bound-mix applies to --format alibaba only: native traces carry bound types")
				}
				if jobs, err = sim.ParseNative(f); err != nil {
					return fmt.Errorf("trace %s: %w", tracePath, err)
				}
			case "alibaba":
				mix, err := sim.ParseBoundMix(mixFlag)
				if err != nil {
					return err
				}
				var st sim.AlibabaStats
				if jobs, st, err = sim.ParseAlibaba(f, mix, seed); err != nil {
					return fmt.Errorf("trace %s: %w", tracePath, err)
				}
				fmt.Fprintf(out, "Alibaba trace: %d rows, %d jobs kept (%d fractional GPU counted as 1), %d skipped without GPU, %d without times.\n",
					st.Rows, st.Kept, st.Fractional, st.NoGPU, st.NoTimes)
				fmt.Fprintf(out, "The trace has no profiles: bound types drawn from %s with seed %d.\n", mix, seed)
			default:
				return fmt.Errorf("unknown --format %q (want native or alibaba)", format)
			}
			if len(jobs) == 0 {
				return fmt.Errorf("trace %s has no jobs", tracePath)
			}
			fmt.Fprintf(out, "Fleet: %d nodes, %d GPUs. Trace: %d jobs, runtimes on %s. Seed %d.\n", len(cl.Nodes), cl.GPUs, len(jobs), sim.ReferenceProduct, seed)
			results, err := sim.Simulate(ctx, cl, jobs, modes, sim.Options{Seed: seed})
			if err != nil {
				return err
			}
			if n := results[0].Unplaceable; n > 0 {
				fmt.Fprintf(out, "%d jobs ask for more GPUs than any node has and are left out.\n", n)
			}
			fmt.Fprintln(out)
			if err := sim.WriteTable(out, results); err != nil {
				return err
			}
			if svgPath != "" {
				if err := writeFile(svgPath, func(w io.Writer) error {
					return sim.WriteCDFSVG(w, fmt.Sprintf("JCT CDF: %d jobs on %d GPUs", len(jobs), cl.GPUs), results)
				}); err != nil {
					return err
				}
			}
			if jsonPath != "" {
				if err := writeFile(jsonPath, func(w io.Writer) error {
					e := json.NewEncoder(w)
					e.SetIndent("", "  ")
					return e.Encode(map[string]any{
						"fleet": fleetPath, "trace": tracePath, "format": format, "seed": seed,
						"referenceGPU": sim.ReferenceProduct, "nodes": len(cl.Nodes), "gpus": cl.GPUs,
						"boundMix": boundMixForJSON(format, mixFlag), "results": results,
					})
				}); err != nil {
					return err
				}
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&fleetPath, "fleet", "", "simulator fleet file (YAML nodeGroups), e.g. demo/sim/fleet.yaml")
	fl.StringVar(&tracePath, "trace", "", "job trace file")
	fl.StringVar(&format, "format", "native", "trace format: native or alibaba")
	fl.StringVar(&mixFlag, "bound-mix", "memory=0.4,compute=0.4,latency=0.2", "bound type distribution for traces without profiles (alibaba)")
	fl.Uint64Var(&seed, "seed", 1, "seed for drawn bound types and for ties between equally scored nodes")
	fl.StringVar(&modesFlag, "modes", "blind,performance,economy", "comma-separated modes to run")
	fl.StringVar(&svgPath, "svg", "", "write a JCT CDF plot of all modes to this SVG file")
	fl.StringVar(&jsonPath, "json", "", "write the results as JSON to this file")
	cmd.AddCommand(newGenerateCommand())
	return cmd
}

func boundMixForJSON(format, mix string) any {
	if format == "alibaba" {
		return mix
	}
	return nil
}

func newGenerateCommand() *cobra.Command {
	c := sim.DefaultGenerateConfig()
	var mixFlag, outPath string
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Write a seeded synthetic trace in the native format",
		Long: `Poisson arrivals, log-normal runtimes on the reference GPU, 1/2/4/8 GPUs
per job (60/15/15/10 %), bound types from --bound-mix, and SM/memory
throughput consistent with each bound type. The same flags give the same
trace.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			mix, err := sim.ParseBoundMix(mixFlag)
			if err != nil {
				return err
			}
			c.Mix = mix
			if c.Jobs < 1 || c.MeanInterarrival < 0 || c.MedianRuntime <= 0 || c.RuntimeSigma < 0 {
				return fmt.Errorf("--jobs must be positive, --interarrival and --runtime-sigma non-negative, --median-runtime positive")
			}
			jobs := sim.Generate(c)
			if outPath == "" || outPath == "-" {
				return sim.WriteNative(cmd.OutOrStdout(), jobs)
			}
			return writeFile(outPath, func(w io.Writer) error { return sim.WriteNative(w, jobs) })
		},
	}
	fl := cmd.Flags()
	fl.IntVar(&c.Jobs, "jobs", c.Jobs, "number of jobs")
	fl.Uint64Var(&c.Seed, "seed", c.Seed, "random seed")
	fl.Float64Var(&c.MeanInterarrival, "interarrival", c.MeanInterarrival, "mean seconds between arrivals")
	fl.Float64Var(&c.MedianRuntime, "median-runtime", c.MedianRuntime, "median runtime on the reference GPU, seconds")
	fl.Float64Var(&c.RuntimeSigma, "runtime-sigma", c.RuntimeSigma, "sigma of log(runtime)")
	fl.StringVar(&mixFlag, "bound-mix", c.Mix.String(), "bound type distribution")
	fl.StringVarP(&outPath, "output", "o", "", "output file (default stdout)")
	return cmd
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return f.Close()
}
