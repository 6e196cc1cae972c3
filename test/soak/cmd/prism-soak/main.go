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

// Command prism-soak churns pods with Prism claims on the local test bed
// while it injects faults, and prints faults by kind with recovery times,
// pods churned, and invariant violations. Run it as root through
// `make soak`; it exits 1 when an invariant was violated.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prismgpu/prism/test/soak"
	"github.com/prismgpu/prism/test/tools/toolmain"
)

func main() {
	var (
		repo       = flag.String("repo", ".", "repository root")
		binDir     = flag.String("bin", "_output/bin-simulation", "directory with prism-kubelet-plugin (a test build: make build-simulation) and prism-controller")
		ncuDir     = flag.String("ncu-dir", "", "directory with the stand-in ncu (go build ./test/tools/fake-ncu)")
		mpsControl = flag.String("mps-control", "", "the stand-in nvidia-cuda-mps-control (go build ./test/tools/fake-mps-control), so that shares run under MPS; empty: they run time-sliced")
		out        = flag.String("out", "_output/soak/soak.json", "JSON output")
		minutes    = flag.Float64("minutes", 10, "how long pods churn and faults are injected")
		seed       = flag.Uint64("seed", 1, "seed of the churn and the fault schedule; the same seed gives the same schedule")
		workers    = flag.Int("workers", 6, "pods kept going at once, each created, run and deleted in turn")
		faultEvery = flag.Duration("fault-every", 90*time.Second, "mean gap between two faults")
		faults     = flag.String("faults", "", "comma-separated fault kinds to inject (empty: all of "+strings.Join(soak.FaultKinds, ",")+")")
		keep       = flag.Bool("keep", false, "keep the test-bed directory (kept anyway when an invariant was violated)")
	)
	ctx, stop := toolmain.Start()
	defer stop()

	var kinds []string
	if *faults != "" {
		kinds = strings.Split(*faults, ",")
		for _, k := range kinds {
			if !slices.Contains(soak.FaultKinds, k) {
				fail(fmt.Errorf("--faults: unknown kind %q, want some of %s", k, strings.Join(soak.FaultKinds, ",")))
			}
		}
	}
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	work, err := os.MkdirTemp("", "prism-soak-")
	if err != nil {
		fail(err)
	}
	res, err := soak.Run(ctx, soak.Options{
		RepoRoot: abs(*repo), PluginBin: filepath.Join(abs(*binDir), "prism-kubelet-plugin"),
		ControllerBin: filepath.Join(abs(*binDir), "prism-controller"), NCUDir: abs(*ncuDir), MPSControl: absOrEmpty(*mpsControl),
		WorkDir: work, Duration: time.Duration(*minutes * float64(time.Minute)), Seed: *seed,
		Workers: *workers, FaultEvery: *faultEvery, Faults: kinds, Log: os.Stdout,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "prism-soak: %v (logs in %s)\n", err, filepath.Join(work, "logs"))
		os.Exit(2)
	}
	fmt.Println()
	res.Print(os.Stdout)
	raw, _ := json.MarshalIndent(res, "", "  ")
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fail(err)
	}
	if err := os.WriteFile(*out, raw, 0o644); err != nil {
		fail(err)
	}
	fmt.Println("wrote", *out)
	if len(res.Violations) > 0 || *keep {
		fmt.Println("test-bed logs kept in", filepath.Join(work, "logs"))
	} else {
		os.RemoveAll(work)
	}
	if len(res.Violations) > 0 {
		os.Exit(1)
	}
}

func absOrEmpty(p string) string {
	if p == "" {
		return ""
	}
	a, err := filepath.Abs(p)
	if err != nil {
		fail(err)
	}
	return a
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "prism-soak:", err)
	os.Exit(2)
}
