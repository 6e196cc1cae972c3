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
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	measured = "../../sim/testdata/measured/"
	slicing  = "../../sim/testdata/slicing/"
)

func TestSimulatePacksTheHandMadeData(t *testing.T) {
	dir := t.TempDir()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{
		"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--slices", measured + "slices.csv",
		"--gpu", "t1", "--gpu-memory", "16384", "--gpus", "8", "--stream", "300",
		"--seeds", "3", "--loads", "0.5,0.9", "--noise", "0,0.2", "--svg", dir,
	})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("simulate: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"Slices: 2 speeds of 2 job types on t1",
		"MIG sizing: no MIG model for t1 (models: a100-40gb); not evaluated.",
		"Packing on t1: 3 job types",
		// 4 policies without noise and prism at 2 levels, 2 loads, 3 seeds.
		"36 runs in",
		"load 90%: prism at 0% noise",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, f := range []string{"packing-goodput.svg", "packing-below80.svg", "packing-median-slowdown.svg"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

func TestSimulateNamesTheBadCellOfAMeasuredFile(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "bad/pairs-speed-nan.csv"}, `pairs-speed-nan.csv:5: column speed_b: "x" is not a number`},
		{[]string{"--jobs", measured + "bad/jobs-util-range.csv", "--pairs", measured + "pairs.csv"}, `jobs-util-range.csv:3: column util_pct: "120" is outside [0, 100]`},
		{[]string{"--jobs", measured + "jobs.csv"}, "--jobs needs --pairs (the packing evaluation), --slices (the MIG sizing evaluation) or both"},
		{[]string{"--jobs", measured + "jobs.csv", "--slices", measured + "slices.csv"}, "slices.csv: no GPU model with a MIG model (models: a100-40gb)"},
		{[]string{"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices-unknown-profile.csv"}, `slice "1g.10gb" is not a MIG profile of a100-40gb`},
		{[]string{"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices.csv", "--policies", "fastest"}, `unknown MIG sizing policy "fastest"`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--gpu", "t1", "--policies", "fastest"}, `unknown packing policy "fastest"`},
		{[]string{"--jobs", measured + "jobs.csv", "--pairs", measured + "pairs.csv", "--gpu", "t1"}, `gpu "t1": its memory is needed`},
	} {
		cmd := NewCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestSimulateSizesMIGSlicesOnTheHandMadeData(t *testing.T) {
	dir := t.TempDir()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{
		"--jobs", slicing + "jobs.csv", "--slices", slicing + "slices.csv",
		"--gpus", "8", "--stream", "300", "--seeds", "3", "--loads", "0.5,0.9", "--noise", "0,0.2", "--svg", dir,
	})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("simulate: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"MIG sizing on a100-40gb: 4 job types",
		// whole-gpu and oracle once, by-memory and prism at 2 noise levels,
		// 2 loads, 3 seeds.
		"36 runs in",
		"load 90%: median slowdown whole-gpu",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "Packing on") {
		t.Errorf("packing ran without --pairs:\n%s", got)
	}
	for _, f := range []string{"goodput", "median-slowdown", "below80", "gpus-needed"} {
		path := filepath.Join(dir, "mig-sizing-a100-40gb-"+f+".svg")
		if st, err := os.Stat(path); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", path, err)
		}
	}
}
