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

func TestSimulateSweepsTheHandMadeExcerpt(t *testing.T) {
	dir := t.TempDir()
	cmd := NewCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs([]string{
		"--nodes", "../../sim/testdata/nodes.csv", "--pods", "../../sim/testdata/pods.csv",
		"--throughputs", "../../../test/bench/data/jobs.csv", "--job-types", "../../../test/bench/data/job-types.csv",
		"--seeds", "3", "--loads", "0.7", "--noise", "0,0.2", "--repeat", "3", "--every", "1",
		"--svg", dir, "--json", filepath.Join(dir, "runs.json"),
	})
	if err := cmd.Execute(); err != nil {
		t.Fatalf("simulate: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"Fleet: 4 nodes, 14 GPUs (K80 2, P100 4, V100 8)",
		"1 Failed, 1 never scheduled, 1 pinned only to models outside the fleet",
		// null-speed, 5 policies without noise levels and 3 Prism ones at 2
		// levels: 12 runs a seed.
		"36 runs, 3 seeds each",
		"prism-load-aware    20%",
		"load 70%: best Prism",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, f := range []string{"slowdown-noise00.svg", "slowdown-noise20.svg", "runs.json"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

func TestSimulateRejectsBadFlags(t *testing.T) {
	const (
		nodes       = "../../sim/testdata/nodes.csv"
		pods        = "../../sim/testdata/pods.csv"
		throughputs = "../../../test/bench/data/jobs.csv"
		jobTypes    = "../../../test/bench/data/job-types.csv"
	)
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
	} {
		cmd := NewCommand()
		cmd.SetOut(&bytes.Buffer{})
		cmd.SetErr(&bytes.Buffer{})
		cmd.SetArgs(tc.args)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to contain %q", tc.args, err, tc.want)
		}
	}
}
