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

// Command prism-bench measures Prism on the local test bed: one table, every
// row comparing two things measured in the same run. It prints a summary of
// the headline ratios (bench.Headlines) and writes the full table next to
// the JSON (bench.txt beside bench.json). Run it as root through `make bench`.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/prismgpu/prism/test/bench"
	"github.com/prismgpu/prism/test/testbed"
	"github.com/prismgpu/prism/test/tools/toolmain"
)

func main() {
	var (
		repo        = flag.String("repo", ".", "repository root")
		binDir      = flag.String("bin", "_output/bin-simulation", "directory with prism-kubelet-plugin (a test build: make build-simulation) and prism-controller")
		out         = flag.String("out", "_output/bench/bench.json", "JSON output")
		sizes       = flag.String("alloc-sizes", "100,500,2000", "allocator fleet sizes (nodes of 8 GPUs); add 5000 for the large case, which takes about twice as long as the default sizes together")
		passes      = flag.Int("alloc-passes", 5, "timed passes over every node per allocator case")
		migRounds   = flag.Int("mig-alloc-rounds", 1000, "timed rounds of the mig-alloc phase, each allocating every claim once")
		schedNodes  = flag.Int("sched-nodes", 500, "nodes for the scheduling phase")
		schedPods   = flag.Int("sched-pods", 200, "pods for each claim kind")
		schedProf   = flag.String("sched-profile", "MemoryBound-performance", "profile of the rewritten claims")
		shareShares = flag.Int("share-packing-shares", 16, "pods of each stream of the share-packing phase, on 8 shareable H100s")
		shareSeed   = flag.Uint64("share-packing-seed", 1, "seed of the shares the share-packing phase's churn stream deletes")
		schedFigs   = flag.Bool("sched-figures-as-capacity", bench.ShippedFiguresAsCapacity, "publish the scheduling phase's slices with the figures as capacities, as the chart's plugin does, and measure the ladder the controller writes by default (capacity floor and tier bounds) beside the CEL form; false measures the CEL form alone, on slices without them")
		prepCalls   = flag.Int("prepare-calls", 300, "prepare+unprepare calls per claim size")
		refPlugin   = flag.String("reference-plugin", "", "dra-example-kubeletplugin binary of kubernetes-sigs/dra-example-driver, built outside this repo; when set, the prepare phase also runs against it")
		floorPlugin = flag.String("floor-plugin", "", "prism-floor-plugin binary (go build ./test/bench/cmd/prism-floor-plugin); when set, the prepare phase measures its memory beside Prism's with --floor-claims claims")
		floorClaims = flag.Int("floor-claims", 500, "memory-share claims on 8 GPUs for the --floor-plugin comparison")
		prepQPS     = flag.Float64("prepare-kube-api-qps", 200, "API client QPS of both plugins in the prepare phase (Prism's default)")
		prepBurst   = flag.Int("prepare-kube-api-burst", 400, "API client burst of both plugins in the prepare phase (Prism's default)")
		prepTrace   = flag.Int("prepare-trace-calls", 100, "claim pairs of the -v=4 pass that breaks one prepare down by stage; 0 skips it")
		prepScale   = flag.String("prepare-scale", "8:500,16:1000", "GPUS:CLAIMS cases of the prepare phase that fill a node with memory-share claims; empty skips them")
		admRate     = flag.Int("admission-rate", 100, "admission requests per second per kind")
		admDuration = flag.Duration("admission-duration", 5*time.Second, "how long the admission rate is held")
		floodRate   = flag.Int("flood-rate", 20, "forged reviews per second in the admission-flood phase, across both replicas")
		floodFor    = flag.Duration("flood-duration", time.Minute, "how long the admission-flood phase floods, and how long its legitimate load runs with and without the flood")
		scaleNodes  = flag.String("scale-nodes", "50,5000", "comma-separated fleet sizes (nodes of 8 GPUs) of the controller-scale phase, smallest first; the largest a multiple of 4")
		scalePer    = flag.Int("scale-claims-per-node", 10, "ResourceClaims per node in the controller-scale phase's informers, half allocated")
		starts      = flag.Int("starts", 5, "plugin starts for the start-up time")
		only        = flag.String("only", "", "comma-separated phases to run (allocator,mig-alloc,packing,share-rule,mig-sizing,scheduling,share-packing,prepare,admission,admission-flood,startup,mps-daemons,usage,controller-scale); empty: all")
		keep        = flag.Bool("keep", false, "keep the test-bed directory")
	)
	ctx, stop := toolmain.Start()
	defer stop()

	rep := &bench.Report{Started: time.Now(), Host: bench.Host{CPUs: runtime.NumCPU(), GoVersion: runtime.Version(), Load1Start: bench.Load1()}}
	alloc := allocatorFlags{sizes: *sizes, passes: *passes, migRounds: *migRounds}
	err := run(ctx, rep, *repo, *binDir, alloc, bench.SchedulingOptions{Nodes: *schedNodes, Pods: *schedPods, Warmup: 10, Profile: *schedProf, FiguresAsCapacity: *schedFigs}, bench.SharePackingOptions{Shares: *shareShares, Seed: *shareSeed}, bench.PrepareOptions{Calls: *prepCalls, Warmup: 10, ReferenceBin: *refPlugin, KubeAPIQPS: *prepQPS, KubeAPIBurst: *prepBurst, TraceCalls: *prepTrace}, *prepScale, *floorPlugin, *floorClaims, *admRate, *admDuration, bench.FloodOptions{FloodRate: *floodRate, AdmissionOptions: bench.AdmissionOptions{Rate: floodLegitRate, Duration: *floodFor}}, *scaleNodes, *scalePer, *starts, *only, *keep)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	rep.Duration = time.Since(rep.Started).Round(time.Second).String()
	rep.Host.Load1End = bench.Load1()
	fmt.Println()
	bench.Summary(os.Stdout, rep)
	table := strings.TrimSuffix(*out, filepath.Ext(*out)) + ".txt"
	if werr := bench.WriteTable(table, rep); werr != nil {
		err = errors.Join(err, werr)
	} else {
		fmt.Printf("\nfull table, %d rows: %s\n", len(rep.Rows), table)
	}
	fmt.Printf("state dir file system: %s; %d CPUs; %s; phases:", rep.Host.StateFS, rep.Host.CPUs, rep.Host.GoVersion)
	for _, p := range rep.Phases {
		fmt.Printf(" %s %ss", p.Phase, p.Seconds)
	}
	fmt.Printf("; total %s\n", rep.Duration)
	if werr := bench.WriteJSON(*out, rep); werr != nil {
		err = errors.Join(err, werr)
	} else {
		fmt.Println("wrote", *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "prism-bench:", err)
		os.Exit(1)
	}
}

// allocatorFlags are the allocator phase's flags.
type allocatorFlags struct {
	sizes             string
	passes, migRounds int
}

func run(ctx context.Context, rep *bench.Report, repo, binDir string, alloc allocatorFlags, sched bench.SchedulingOptions, share bench.SharePackingOptions,
	prep bench.PrepareOptions, prepScale, floorBin string, floorClaims int, admRate int, admDuration time.Duration, flood bench.FloodOptions, scaleNodes string, scalePer, starts int, only string, keep bool) (retErr error) {
	logger := klog.FromContext(ctx)
	want := func(phase string) bool {
		return only == "" || strings.Contains(","+only+",", ","+phase+",")
	}
	repo, _ = filepath.Abs(repo)
	binDir, _ = filepath.Abs(binDir)
	if prep.ReferenceBin != "" {
		prep.ReferenceBin, _ = filepath.Abs(prep.ReferenceBin)
	}
	if floorBin != "" {
		floorBin, _ = filepath.Abs(floorBin)
	}
	phase := func(name string, fn func() error) error {
		start := time.Now()
		logger.Info("Phase", "name", name)
		err := fn()
		rep.Phases = append(rep.Phases, bench.PhaseTiming{Phase: name, Seconds: fmt.Sprintf("%.1f", time.Since(start).Seconds())})
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		return nil
	}
	// rowsPhase runs a wanted phase whose result is rows of the table.
	rowsPhase := func(name string, fn func() ([]bench.Row, error)) error {
		if !want(name) {
			return nil
		}
		return phase(name, func() error {
			rows, err := fn()
			rep.Rows = append(rep.Rows, rows...)
			return err
		})
	}

	// In process, before the cluster exists, so that it has the CPUs.
	if err := rowsPhase("allocator", func() ([]bench.Row, error) {
		var sizes []int
		for _, s := range strings.Split(alloc.sizes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil {
				return nil, fmt.Errorf("--alloc-sizes: %w", err)
			}
			sizes = append(sizes, n)
		}
		return bench.Allocator(ctx, bench.AllocatorOptions{Sizes: sizes, Passes: alloc.passes})
	}); err != nil {
		return err
	}
	// In process too: one partitioned node against a plain one.
	if err := rowsPhase("mig-alloc", func() ([]bench.Row, error) {
		return bench.MIGAllocator(ctx, bench.MIGAllocOptions{Rounds: alloc.migRounds})
	}); err != nil {
		return err
	}
	// Pure computation on the shipped measured data: the packing table, and
	// the MIG sizing table on measured slice speeds.
	for _, table := range []struct {
		phase, title string
		rows         func(ctx context.Context, repo string, w io.Writer) ([]bench.Row, error)
	}{
		{"packing", "Packing on measured co-location data", bench.Packing},
		{"share-rule", "The share-sizing rule's parameters, fitted on one GPU model and judged on the others", bench.ShareRule},
		{"mig-sizing", "MIG sizing on measured slice speeds", bench.MIGSizing},
	} {
		if err := rowsPhase(table.phase, func() ([]bench.Row, error) {
			fmt.Println(table.title + " (test/bench/data, docs/simulator.md):")
			return table.rows(ctx, repo, os.Stdout)
		}); err != nil {
			return err
		}
	}
	if !want("scheduling") && !want("share-packing") && !want("prepare") && !want("admission") && !want("admission-flood") && !want("startup") && !want("mps-daemons") && !want("usage") && !want("controller-scale") {
		return nil
	}

	// Short: unix socket paths are limited to 108 bytes. /tmp is where the
	// plugin's checkpoint is fsynced; its file system is reported.
	dir, err := os.MkdirTemp("/tmp", "prism-bench-")
	if err != nil {
		return err
	}
	rep.Host.StateFS = bench.FSType(dir)
	var c *testbed.Cluster
	defer func() {
		if c != nil {
			c.Stop(context.WithoutCancel(ctx))
		}
		if keep || retErr != nil {
			fmt.Fprintln(os.Stderr, "test-bed directory kept:", dir)
			return
		}
		_ = os.RemoveAll(dir)
	}()
	if err := phase("testbed", func() error {
		c, err = testbed.Start(ctx, testbed.Options{
			WorkDir: dir,
			CRDDirs: []string{filepath.Join(repo, "deployments", "crds")},
			// Hand-made nodes would otherwise start tainted not-ready.
			ExtraAPIServerArgs: map[string]string{"disable-admission-plugins": "TaintNodesByCondition"},
		})
		if err != nil {
			return err
		}
		if out, err := testbed.Kubectl(ctx, c, "apply", "-f", filepath.Join(repo, "deployments", "static", "deviceclasses.yaml")); err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}); err != nil {
		if c == nil {
			keep = true
		}
		return err
	}
	cfg := *c.Config
	cfg.QPS, cfg.Burst = 1000, 2000
	client, err := kubernetes.NewForConfig(&cfg)
	if err != nil {
		return err
	}
	pluginBin := filepath.Join(binDir, "prism-kubelet-plugin")
	fleet := filepath.Join(repo, "demo", "fleets", "h100-sxm-8.yaml")

	var errs []error
	errs = append(errs, rowsPhase("scheduling", func() ([]bench.Row, error) {
		return bench.Scheduling(ctx, c, client, sched)
	}))
	errs = append(errs, rowsPhase("share-packing", func() ([]bench.Row, error) {
		share.Fleet = fleet
		return bench.SharePacking(ctx, c, client, share)
	}))
	var footprint []bench.Row
	if want("prepare") {
		errs = append(errs, phase("prepare", func() error {
			prep.PluginBin, prep.Fleet, prep.Dir = pluginBin, fleet, filepath.Join(dir, "prep")
			res, err := bench.Prepare(ctx, c, client, prep)
			if err != nil {
				return err
			}
			rep.Rows = append(rep.Rows, res.Rows...)
			scale, err := bench.PrepareScale(ctx, c, client, prep, prepScale)
			rep.Rows = append(rep.Rows, scale...)
			if err != nil {
				return err
			}
			footprint = append(footprint, bench.NewRow("footprint", "prism-kubelet-plugin, 8 simulated H100", "RSS (VmRSS)", "MiB",
				"idle", res.IdleRSS, "after prepare load", res.LoadedRSS, fmt.Sprintf("after %d prepare+unprepare", 2*(prep.Calls+prep.Warmup))))
			if ref := res.Reference; ref != nil {
				footprint = append(footprint,
					bench.NewRow("footprint", "same run, 8 GPUs each", "RSS idle (VmRSS)", "MiB", "example driver", ref.IdleRSS, "Prism", res.IdleRSS, ""),
					bench.NewRow("footprint", "same run, 8 GPUs each", "RSS after prepare load (VmRSS)", "MiB", "example driver", ref.LoadedRSS, "Prism", res.LoadedRSS, fmt.Sprintf("after %d prepare+unprepare each", 2*(prep.Calls+prep.Warmup))))
			}
			if floorBin != "" {
				rows, err := bench.PrepareFloor(ctx, c, client, prep, floorBin, floorClaims)
				footprint = append(footprint, rows...)
				if err != nil {
					return fmt.Errorf("floor: %w", err)
				}
			}
			return nil
		}))
	}
	if want("admission") {
		errs = append(errs, phase("admission", func() error {
			res, err := bench.Admission(ctx, c, client, bench.AdmissionOptions{ControllerBin: filepath.Join(binDir, "prism-controller"), RepoRoot: repo, Rate: admRate, Duration: admDuration})
			if err != nil {
				return err
			}
			rep.Rows = append(rep.Rows, res.Rows...)
			footprint = append(footprint, bench.NewRow("footprint", "prism-controller", "RSS (VmRSS)", "MiB",
				"idle", res.IdleRSS, "after admission load", res.LoadedRSS, ""))
			return nil
		}))
	}
	errs = append(errs, rowsPhase("admission-flood", func() ([]bench.Row, error) {
		flood.ControllerBin, flood.RepoRoot = filepath.Join(binDir, "prism-controller"), repo
		return bench.AdmissionFlood(ctx, c, client, flood)
	}))
	if want("startup") {
		errs = append(errs, phase("startup", func() error {
			res, err := bench.Startup(ctx, c, client, pluginBin, fleet, filepath.Join(dir, "start"), starts)
			if err != nil {
				return err
			}
			footprint = append(footprint, bench.NewRow("footprint", fmt.Sprintf("prism-kubelet-plugin start, median of %d", starts), "process start to ...", "ms",
				"/readyz", float64(bench.Median(res.Ready))/1e6, "slice visible", float64(bench.Median(res.Slice))/1e6,
				"slice: "+joinDurations(res.Slice)))
			return nil
		}))
	}
	errs = append(errs, rowsPhase("mps-daemons", func() ([]bench.Row, error) {
		return bench.MPSDaemons(ctx, c, client, bench.MPSDaemonsOptions{PluginBin: pluginBin, Fleet: fleet, Dir: filepath.Join(dir, "mps"), Repo: repo})
	}))
	errs = append(errs, rowsPhase("usage", func() ([]bench.Row, error) {
		return bench.Usage(ctx, c, client, pluginBin, fleet, filepath.Join(dir, "usage"))
	}))
	// Last: it leaves tens of thousands of claims in the API server.
	errs = append(errs, rowsPhase("controller-scale", func() ([]bench.Row, error) {
		var sizes []int
		for _, f := range strings.Split(scaleNodes, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return nil, fmt.Errorf("--scale-nodes %q: want positive node counts", scaleNodes)
			}
			sizes = append(sizes, n)
		}
		return bench.ControllerScale(ctx, c, client, bench.ControllerScaleOptions{
			AdmissionOptions: bench.AdmissionOptions{ControllerBin: filepath.Join(binDir, "prism-controller"), RepoRoot: repo, Rate: admRate, Duration: admDuration},
			Nodes:            sizes, ClaimsPerNode: scalePer,
		})
	}))
	rep.Rows = append(rep.Rows, footprint...)
	return errors.Join(errs...)
}

// floodLegitRate is the admission-flood phase's legitimate load, requests
// per second per kind per replica: lighter than the admission phase's,
// since two replicas and the flood share the machine's cores.
const floodLegitRate = 20

func joinDurations(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return strings.Join(parts, " ")
}
