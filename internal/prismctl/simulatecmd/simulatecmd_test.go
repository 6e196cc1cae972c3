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
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"

	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/internal/sim"
)

const (
	measured    = "../../sim/testdata/measured/"
	slicing     = "../../sim/testdata/slicing/"
	nodes       = "../../sim/testdata/nodes.csv"
	pods        = "../../sim/testdata/pods.csv"
	throughputs = "../../../test/bench/data/jobs.csv"
	jobTypes    = "../../../test/bench/data/job-types.csv"
	// shippedPairs and shippedSlices are the measured data make bench
	// runs on.
	shippedPairs  = "../../../test/bench/data/pairs.csv"
	shippedSlices = "../../../test/bench/data/slices.csv"
)

func TestSimulateRunsOnTheHandMadeData(t *testing.T) {
	for _, tc := range []struct {
		name string
		// args are the flags but --svg and --json, which name a fresh
		// directory and a file in it.
		args []string
		json bool
		want []string
		// absent must not be printed.
		absent []string
		// files are written into the --svg directory.
		files []string
	}{{
		name: "trace replay",
		args: []string{
			"--nodes", nodes, "--pods", pods, "--throughputs", throughputs, "--job-types", jobTypes,
			"--seeds", "3", "--loads", "0.7", "--noise", "0,0.2", "--repeat", "3", "--every", "1",
		},
		json: true,
		want: []string{
			"Fleet: 4 nodes, 14 GPUs (K80 2, P100 4, V100 8)",
			"1 Failed, 1 never scheduled, 1 pinned only to models outside the fleet",
			// null-speed, 5 policies without noise levels and 3 Prism ones at 2
			// levels: 12 runs a seed.
			"36 runs, 3 seeds each",
			"prism-load-aware    20%",
			"load 70%: best Prism",
		},
		files: []string{"slowdown-noise00.svg", "slowdown-noise20.svg", "runs.json"},
	}, {
		name: "packing",
		args: []string{
			"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--slices", measured + "slices.csv",
			"--gpu", "t1", "--gpu-memory", "16384", "--gpus", "8", "--stream", "300",
			"--seeds", "3", "--loads", "0.5,0.9", "--noise", "0,0.2",
		},
		want: []string{
			"Slices: 2 speeds, 0 did not fit and 1 not measured (empty), of 3 job types on t1",
			"MIG sizing: no MIG model for t1 (models: a100-40gb); not evaluated.",
			"Packing on t1: 3 job types",
			// 4 policies without noise and prism at 2 levels, 2 loads, 3 seeds.
			"36 runs in",
			"load 90%: prism at 0% noise",
		},
		files: []string{"packing-goodput.svg", "packing-below80.svg", "packing-median-slowdown.svg"},
	}, {
		name: "packing without the job types lacking a pair",
		args: []string{
			"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs-incomplete.csv", "--skip-incomplete",
			"--gpu", "t1", "--gpu-memory", "16384", "--gpus", "4", "--stream", "100", "--seeds", "1", "--loads", "0.5", "--noise", "0",
		},
		want: []string{
			"Packing on t1: 2 job types",
			"Left out (--skip-incomplete), as the pair table lacks a pair of them: heavy (lacks 1 pair: heavy + heavy).",
		},
	}, {
		name: "packing on the shipped H100 pairs under MPS reads two speeds as 1",
		args: []string{
			"--jobs", throughputs, "--pairs", shippedPairs, "--gpu", "h100-mps",
			"--gpus", "4", "--stream", "100", "--seeds", "1", "--loads", "0.5", "--noise", "0", "--gpus-needed=false",
		},
		want: []string{"Read as 1, as measurement noise", "2 speeds, ", "speed_a 1.0004", "speed_b 1.0039"},
	}, {
		name: "MIG sizing on the shipped slices: every slice measured or did not fit",
		args: []string{
			"--jobs", throughputs, "--slices", shippedSlices,
			"--gpus", "4", "--stream", "100", "--seeds", "1", "--loads", "0.5", "--noise", "0", "--gpus-needed=false",
		},
		want: []string{
			"MIG sizing on a100-40gb: 32 job types",
			"Read as 1, as measurement noise", "speed 1.0035",
		},
		absent: []string{"Not measured", "not measured"},
	}, {
		name: "MIG sizing",
		args: []string{
			"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices.csv",
			"--gpus", "8", "--stream", "300", "--seeds", "3", "--loads", "0.5,0.9", "--noise", "0,0.2",
		},
		want: []string{
			"MIG sizing on a100-40gb: 4 job types",
			// whole-gpu and oracle once, by-memory and prism at 2 noise levels,
			// 2 loads, 3 seeds.
			"36 runs in",
			"load 90%: median slowdown whole-gpu",
		},
		// Without --pairs, packing does not run.
		absent: []string{"Packing on"},
		files: []string{
			"mig-sizing-a100-40gb-goodput.svg", "mig-sizing-a100-40gb-median-slowdown.svg",
			"mig-sizing-a100-40gb-below80.svg", "mig-sizing-a100-40gb-gpus-needed.svg",
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := append(slices.Clone(tc.args), "--svg", dir)
			if tc.json {
				args = append(args, "--json", filepath.Join(dir, "runs.json"))
			}
			got, err := explaintest.Execute(NewCommand(), args...)
			if err != nil {
				t.Fatalf("simulate: %v\n%s", err, got)
			}
			for _, want := range tc.want {
				if !strings.Contains(got, want) {
					t.Errorf("output lacks %q:\n%s", want, got)
				}
			}
			for _, absent := range tc.absent {
				if strings.Contains(got, absent) {
					t.Errorf("output has %q:\n%s", absent, got)
				}
			}
			for _, f := range tc.files {
				if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
					t.Errorf("%s not written: %v", f, err)
				}
			}
		})
	}
}

func TestSimulateRejectsBadInput(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--pods", "x"}, "--nodes and --pods are required"},
		{[]string{"--nodes", nodes, "--pods", pods, "--throughputs", throughputs, "--job-types", jobTypes, "--policies", "fastest"}, "fastest"},
		{[]string{"--nodes", nodes, "--pods", pods, "--throughputs", throughputs, "--job-types", jobTypes, "--loads", "2"}, `--loads: "2" is not a number`},
		{[]string{"--nodes", nodes, "--pods", pods}, "--throughputs and --job-types are required"},
		{[]string{"--nodes", nodes, "--pods", pods, "--throughputs", throughputs}, "--throughputs and --job-types are required"},
		{[]string{"--nodes", nodes, "--pods", pods, "--throughputs", throughputs, "--job-types", "../../sim/testdata/jobtypes/bad/job-types-nan.csv"},
			`job-types-nan.csv:2: column sm_pct: "ten" is not a number`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "bad/pairs-speed-nan.csv"}, `pairs-speed-nan.csv:5: pair "b", "a" on gpu "t1": column speed_b: "x" is not a number`},
		{[]string{"--jobs", measured + "bad/jobs-util-range.csv", "--pairs", measured + "pairs.csv"}, `jobs-util-range.csv:3: column util_pct: "120" is outside [0, 100]`},
		{[]string{"--jobs", measured + "jobs.csv"}, "--jobs needs --pairs (the packing evaluation), --slices (the MIG sizing evaluation) or both"},
		{[]string{"--jobs", measured + "jobs.csv", "--slices", measured + "slices.csv"}, "slices.csv: no GPU model with a MIG model (models: a100-40gb)"},
		{[]string{"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices-unknown-profile.csv"}, `slice "1g.10gb" is not a MIG profile of a100-40gb`},
		{[]string{"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices.csv", "--policies", "fastest"}, `unknown MIG sizing policy "fastest"`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--gpu", "t1", "--policies", "fastest"}, `unknown packing policy "fastest"`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--gpu", "t1"}, `gpu "t1": its memory is needed`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs-incomplete.csv", "--gpu", "t1", "--gpu-memory", "16384"},
			`gpu "t1": the pair table lacks 1 of the 6 pairs of its job types (--skip-incomplete leaves out job types until none is missing): heavy + heavy`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "bad/pairs-above-one.csv", "--gpu", "t1", "--gpu-memory", "16384"},
			`pairs-above-one.csv:2: pair "light", "medium" on gpu "t1": column speed_a: "1.2" is above 1: a job beside another cannot run faster than alone`},
	} {
		if _, err := explaintest.Execute(NewCommand(), tc.args...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
}

// The help of the flags the evaluations on measured data share with the
// trace replay says what they do there, and --gpu-memory lists the models
// it has a figure for from the table that holds them, as the docs do.
func TestFlagHelpSaysWhatTheCodeDoes(t *testing.T) {
	fl := NewCommand().Flags()
	usage := fl.Lookup("gpu-memory").Usage
	_, list, ok := strings.Cut(usage, "built-in figure for ")
	list, _, _ = strings.Cut(list, ")")
	if !ok {
		t.Fatalf("--gpu-memory: %q names no built-in figures", usage)
	}
	if diff := cmp.Diff(sim.GPUMemoryModels(), strings.Split(list, ", ")); diff != "" {
		t.Errorf("--gpu-memory lists (-want +got):\n%s", diff)
	}
	doc, err := os.ReadFile("../../../docs/simulator.md")
	if err != nil {
		t.Fatal(err)
	}
	_, row, _ := strings.Cut(string(doc), "| `--gpu-memory` |")
	_, list, _ = strings.Cut(row, "`sim.GPUMemoryMiB`: ")
	list, _, _ = strings.Cut(list, ";")
	if diff := cmp.Diff(sim.GPUMemoryModels(), strings.Split(list, ", ")); diff != "" {
		t.Errorf("docs/simulator.md's --gpu-memory lists (-want +got):\n%s", diff)
	}
	for _, want := range []string{"wrong classifier labels", "util_pct", "mem_mib", "1 ± noise"} {
		if usage := fl.Lookup("noise").Usage; !strings.Contains(usage, want) {
			t.Errorf("--noise: %q does not say %q", usage, want)
		}
	}
}

// Every flag's help is a sentence, and docs/simulator.md names the flag,
// where it says when to change it.
func TestEveryFlagIsASentenceTheDocsName(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/simulator.md")
	if err != nil {
		t.Fatal(err)
	}
	type flag struct{ Sentence, Documented bool }
	want, got := map[string]flag{}, map[string]flag{}
	NewCommand().Flags().VisitAll(func(f *pflag.Flag) {
		want[f.Name] = flag{true, true}
		named := regexp.MustCompile("--" + regexp.QuoteMeta(f.Name) + "([^a-z0-9-]|$)")
		got[f.Name] = flag{
			Sentence:   f.Usage != "" && unicode.IsUpper([]rune(f.Usage)[0]) && strings.HasSuffix(f.Usage, "."),
			Documented: named.Match(doc),
		}
	})
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("flags (-want +got):\n%s", diff)
	}
}
