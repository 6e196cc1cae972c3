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

// Package simulatecmd implements `prismctl simulate`: replay the public
// Alibaba GPU trace on its own node list under every placement policy,
// sweeping load and label noise (--nodes, --pods, with the job types of
// --throughputs and --job-types), or pack a job stream onto GPUs by measured
// use and judge it on measured co-location data (--jobs, --pairs), or size
// MIG slices by measured use and judge them on measured slice speeds
// (--jobs, --slices).
package simulatecmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prismgpu/prism/internal/sim"
)

// NewCommand returns the `simulate` command.
func NewCommand() *cobra.Command {
	var (
		nodesPath, podsPath, throughputsPath, jobTypesPath   string
		policiesFlag, loadsFlag, noiseFlag, svgDir, jsonPath string
		seeds, workers, every, repeat                        int
		withoutK80, strictTiers                              bool
		opts                                                 = sim.PodOptions{Cap: 2 * 24 * 3600, WindowQuantile: 0.01}
		pack                                                 packFlags
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Sweep placement policies over load and label noise on the Alibaba GPU trace",
		Long: `Replays a pod list of Alibaba's cluster-trace-gpu-v2023 on the trace's own GPU
node list (P100 and V100 nodes as they are, T4 nodes re-equipped with K80s),
once per policy, load, label-noise level and seed. Each pod is given a job
type of --job-types; its true speed on each GPU model is the type's
throughput in --throughputs (test/bench/data in Prism's repository has
Gavel's measurements), while Prism decides from the classifier's bound type
of the type's SM and memory figures (wrong for --noise of the pods) through
the admission controller's rewrite.Rewrite. See docs/simulator.md.

Prints median and p99 slowdown, mean JCT, multi-GPU wait and fragmentation
with 95 % confidence intervals over seeds, and a verdict at loads of 70 %
and more: whether the best Prism policy's median slowdown is 1.3x better
than the best profile-free policy's, with a p99 and a multi-GPU wait no
worse than a profile-blind placement's.

With --jobs and --pairs instead, it runs the packing evaluation: a stream
of jobs drawn from jobs.csv for one GPU model (--gpu) arrives at each load
onto --gpus GPUs; each policy places jobs reading only jobs.csv (prism
through the share-sizing rule, a job's util_pct and mem_mib each scaled by
one factor drawn in 1 ± --noise), and the judge rates every job from
pairs.csv, which must hold every pair of the GPU model's job types
(--skip-incomplete leaves out the job types it lacks a pair of). Prints
goodput per GPU, the shares of jobs below 80 and 90 % of their speed
alone, median and p99 slowdown and the GPUs needed, with 95 % confidence
intervals over seeds, and the acceptance verdict.

With --jobs and --slices, it runs the MIG sizing evaluation on every GPU
model of slices.csv that has a MIG model (a100-40gb): the stream arrives
onto --gpus GPUs cut into MIG slices as jobs come; whole-gpu, by-memory
(smallest slice holding the measured memory), prism (the share-sizing rule
mapped to the smallest slice covering its memory and compute) and oracle
(reads slices.csv: the smallest slice at 80 % of whole-GPU speed) are
judged on slices.csv's speeds; by-memory and prism read util_pct and
mem_mib scaled by 1 ± --noise. With --pairs too, both run. File formats:
docs/simulator.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			out := cmd.OutOrStdout()
			if pack.jobs != "" || pack.pairs != "" || pack.slices != "" {
				pack.loads, pack.noise, pack.svgDir, pack.seeds, pack.workers = loadsFlag, noiseFlag, svgDir, seeds, workers
				if cmd.Flags().Changed("policies") {
					pack.policies = policiesFlag
				}
				return runMeasured(cmd, pack)
			}
			if nodesPath == "" || podsPath == "" {
				return fmt.Errorf("--nodes and --pods are required (openb_node_list_gpu_node.csv and an openb_pod_list_*.csv with time columns), or --jobs and --pairs for the packing evaluation")
			}
			if throughputsPath == "" || jobTypesPath == "" {
				return fmt.Errorf("--throughputs and --job-types are required with --nodes and --pods (formats in docs/simulator.md; Prism's repository has Gavel's figures in test/bench/data/jobs.csv and job-types.csv)")
			}
			var sw sim.Sweep
			var err error
			if sw.Policies, sw.Loads, sw.Noises, err = sweepAxes(policiesFlag, nil, loadsFlag, noiseFlag, sim.ParsePolicy); err != nil {
				return err
			}
			if seeds < 1 || workers < 1 {
				return fmt.Errorf("--seeds and --workers must be at least 1")
			}
			sw.Seeds, sw.Workers, sw.StrictTiers = seeds, workers, strictTiers
			types, err := sim.ReadJobTypes(throughputsPath, jobTypesPath)
			if err != nil {
				return err
			}
			machines, nst, err := readWith(nodesPath, sim.ParseNodes)
			if err != nil {
				return err
			}
			pods, pst, err := readWith(podsPath, func(r io.Reader) ([]*sim.Pod, sim.PodStats, error) { return sim.ParsePods(r, opts) })
			if err != nil {
				return err
			}
			if every < 1 || repeat < 1 {
				return fmt.Errorf("--every and --repeat must be at least 1")
			}
			if withoutK80 {
				var dropped int
				machines, pods, dropped = sim.WithoutModel(machines, pods, sim.K80)
				fmt.Fprintf(out, "Without the K80 stand-ins: %d pods pinned to T4 alone dropped.\n", dropped)
			}
			machines = sim.Subsample(machines, every)
			env, err := sim.NewEnv(ctx, machines, pods, repeat, types)
			if err != nil {
				return err
			}
			counts := map[sim.ModelID]int{}
			for _, m := range machines {
				counts[m.Model] += m.GPUs
			}
			fmt.Fprintf(out, "Fleet: %d nodes, %d GPUs (K80 %d, P100 %d, V100 %d); left out of the node list (GPUs): %v.\n",
				len(machines), env.GPUs, counts[sim.K80], counts[sim.P100], counts[sim.V100], nst.Skipped)
			fmt.Fprintf(out, "Pods: %d rows; %d without GPU, %d Failed, %d never scheduled, %d pinned only to models outside the fleet, %d before the arrival window dropped; %d kept, %d unplaceable on this fleet.\n",
				pst.Rows, pst.NoGPU, pst.Failed, pst.NeverScheduled, pst.PinnedElsewhere, pst.BeforeWindow, pst.Kept, env.Unplaceable)
			fmt.Fprintf(out, "Replayed %d times back to back (%d pods a run, copies 2 to %d measured).\n", repeat, len(env.Pods), max(1, repeat-1))
			fmt.Fprintf(out, "Of those kept: %d censored (running at the trace's end), %d capped at %.0f s, %d sharing a GPU, %d multi-GPU.\n",
				pst.Censored, pst.Capped, opts.Cap, pst.Shared, pst.MultiGPU)
			fmt.Fprintln(out, "Prism's ladders on this fleet (policy/classifier label: subrequests):")
			for _, k := range sortedKeys(env.Ladders) {
				fmt.Fprintf(out, "  %s: %v\n", k, env.Ladders[k])
			}
			start := time.Now()
			results, err := env.Execute(ctx, sw)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "%d runs, %d seeds each, in %s.\n\n", len(results), seeds, time.Since(start).Round(time.Second))
			rows := sim.Summarise(results)
			if err := sim.WriteSweepTable(out, rows); err != nil {
				return err
			}
			fmt.Fprintln(out)
			for _, v := range sim.Verdict(rows, 0.7) {
				fmt.Fprintln(out, v)
			}
			if svgDir != "" {
				err := writePlots(out, svgDir, sw.Noises, func(noise float64) (string, func(io.Writer) error) {
					title := fmt.Sprintf("Median slowdown vs load, Prism labels %.0f%% wrong (%d seeds, 95%% CI)", 100*noise, seeds)
					return fmt.Sprintf("slowdown-noise%02.0f.svg", 100*noise), func(w io.Writer) error { return sim.WriteLoadSVG(w, title, rows, noise) }
				})
				if err != nil {
					return err
				}
			}
			if jsonPath != "" {
				return writeFile(jsonPath, func(w io.Writer) error {
					e := json.NewEncoder(w)
					e.SetIndent("", "  ")
					return e.Encode(map[string]any{"nodes": nodesPath, "pods": podsPath, "throughputs": throughputsPath, "jobTypes": jobTypesPath, "podStats": pst, "nodeStats": nst, "ladders": env.Ladders, "results": results})
				})
			}
			return nil
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&nodesPath, "nodes", "", "Trace node list (openb_node_list_gpu_node.csv).")
	fl.StringVar(&podsPath, "pods", "", "Trace pod list with time columns (openb_pod_list_default.csv or a gpuspec variant).")
	fl.StringVar(&throughputsPath, "throughputs", "", "Trace replay: a jobs.csv whose k80, p100 and v100 rows give each job type's throughput alone, the true speeds; required with --nodes.")
	fl.StringVar(&jobTypesPath, "job-types", "", "Trace replay: the job types pods are drawn from with their classifier input (job,sm_pct,mem_pct); required with --nodes.")
	fl.StringVar(&policiesFlag, "policies", joinPolicies(), "Comma-separated policies.")
	fl.StringVar(&loadsFlag, "loads", "0.3,0.5,0.7,0.9", "Target utilisations to compress arrivals to.")
	fl.StringVar(&noiseFlag, "noise", "0,0.1,0.2,0.4", "Trace replay: shares of wrong classifier labels (Prism policies); packing and MIG sizing: the largest relative error on each job's util_pct and mem_mib, one factor drawn uniformly in 1 ± noise (prism; by-memory too in MIG sizing).")
	fl.IntVar(&seeds, "seeds", 10, "Seeds per configuration (job types, label noise, ties).")
	fl.IntVar(&workers, "workers", 2, "Simulations run in parallel.")
	fl.IntVar(&every, "every", 8, "Keep every n-th node of each (model, GPU count) group of the node list.")
	fl.IntVar(&repeat, "repeat", 6, "Replay the pod list this many times back to back; the first and last copies are warm-up and drain.")
	fl.Float64Var(&opts.Cap, "cap", opts.Cap, "Cap on pod runtimes in seconds (0: none); capped pods are counted.")
	fl.Float64Var(&opts.WindowQuantile, "window-quantile", opts.WindowQuantile, "Drop pods created before this quantile of creation times.")
	fl.BoolVar(&withoutK80, "without-k80", false, "Leave out the T4 nodes the fleet re-equips with K80s (measured models only).")
	fl.BoolVar(&strictTiers, "strict-tiers", false, "Let the best subrequest decide before CPU and memory scores, instead of kube-scheduler's weighted sum.")
	fl.StringVar(&svgDir, "svg", "", "Write slowdown-vs-load plots, one per noise level, into this directory.")
	fl.StringVar(&jsonPath, "json", "", "Write every run's result as JSON to this file.")
	fl.StringVar(&pack.jobs, "jobs", "", "Packing: jobs.csv (job,gpu,throughput,util_pct,sm_pct,dram_pct,mem_mib), what policies read.")
	fl.StringVar(&pack.pairs, "pairs", "", "Packing: pairs.csv (job_a,job_b,gpu,speed_a,speed_b), what the judge reads.")
	fl.StringVar(&pack.slices, "slices", "", "MIG sizing: slices.csv (job,gpu,slice,speed), what its judge reads.")
	fl.StringVar(&pack.gpu, "gpu", "v100", "Packing: the GPU model of jobs.csv to pack.")
	fl.Float64Var(&pack.gpuMemMiB, "gpu-memory", 0, "Packing: the GPU's memory in MiB (0: the built-in figure for "+strings.Join(sim.GPUMemoryModels(), ", ")+").")
	fl.BoolVar(&pack.skipIncomplete, "skip-incomplete", false, "Packing: leave out the job types of --gpu that pairs.csv lacks a pair of (self-pairs included) and name them, instead of refusing.")
	fl.IntVar(&pack.gpus, "gpus", 32, "Packing and MIG sizing: GPUs the stream runs on.")
	fl.IntVar(&pack.jobsPerRun, "stream", 2000, "Packing and MIG sizing: jobs per run.")
	fl.BoolVar(&pack.gpusNeeded, "gpus-needed", true, "Packing and MIG sizing: also search the fewest GPUs that serve each run's stream.")
	return cmd
}

func readWith[T, S any](path string, parse func(io.Reader) (T, S, error)) (T, S, error) {
	f, err := os.Open(path)
	if err != nil {
		var t T
		var s S
		return t, s, err
	}
	defer f.Close()
	t, s, err := parse(f)
	if err != nil {
		err = fmt.Errorf("%s: %w", path, err)
	}
	return t, s, err
}

func floats(flag, s string) ([]float64, error) {
	var out []float64
	for part := range strings.SplitSeq(s, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(part), 64)
		if err != nil || v < 0 || v > 1.5 {
			return nil, fmt.Errorf("%s: %q is not a number in [0, 1.5]", flag, part)
		}
		out = append(out, v)
	}
	return out, nil
}

func joinPolicies() string {
	names := make([]string, len(sim.Policies))
	for i, p := range sim.Policies {
		names[i] = string(p)
	}
	return strings.Join(names, ",")
}

func sortedKeys(m map[string][]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// sweepAxes reads what a sweep runs over: the policies of a
// comma-separated list (all of them, where all is given, for an empty
// one), the loads and the noise levels.
func sweepAxes[P any](policies string, all []P, loads, noise string, parse func(string) (P, error)) ([]P, []float64, []float64, error) {
	ps := all
	if policies != "" || all == nil {
		ps = nil
		for p := range strings.SplitSeq(policies, ",") {
			pol, err := parse(strings.TrimSpace(p))
			if err != nil {
				return nil, nil, nil, err
			}
			ps = append(ps, pol)
		}
	}
	ls, err := floats("--loads", loads)
	if err != nil {
		return nil, nil, nil, err
	}
	ns, err := floats("--noise", noise)
	if err != nil {
		return nil, nil, nil, err
	}
	return ps, ls, ns, nil
}

// writePlots writes a plot of each of what into dir, creating it, and
// names each file it wrote on out. plot gives a plot's file name and how
// to draw it.
func writePlots[T any](out io.Writer, dir string, what []T, plot func(T) (name string, draw func(io.Writer) error)) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for _, x := range what {
		name, draw := plot(x)
		path := filepath.Join(dir, name)
		if err := writeFile(path, draw); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %s\n", path)
	}
	return nil
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
