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

package sim

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// shippedData is where the repository keeps the figures `make bench-sim`
// replays the trace with; the simulation tests run on them too.
var shippedData = filepath.Join("..", "..", "test", "bench", "data")

func shippedJobTypes(t *testing.T) []JobType {
	t.Helper()
	types, err := ReadJobTypes(filepath.Join(shippedData, "jobs.csv"), filepath.Join(shippedData, "job-types.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return types
}

var handMadeJobTypes = filepath.Join("testdata", "jobtypes")

func TestReadJobTypesKeepsTheDrawOrderAndEveryFigure(t *testing.T) {
	got, err := ReadJobTypes(filepath.Join(handMadeJobTypes, "jobs.csv"), filepath.Join(handMadeJobTypes, "job-types.csv"))
	if err != nil {
		t.Fatal(err)
	}
	want := []JobType{
		{Name: "tiny", SMPct: 10, MemPct: 8, Throughput: [numModels]float64{K80: 3.5, P100: 3.5, V100: 7}},
		{Name: "conv, large", SMPct: 85.5, MemPct: 55, Throughput: [numModels]float64{K80: 1, P100: 4, V100: 8}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if s := got[1].Speed(P100); s != 0.5 {
		t.Errorf("speed of %q on P100 = %v, want 4/8 = 0.5", got[1].Name, s)
	}
}

func TestMalformedJobTypeFilesAreNamedByFileAndLine(t *testing.T) {
	for _, tc := range []struct {
		jobs, jobTypes string // a bad file; the other is the good one
		want           string
	}{
		// The format of jobs.csv is ParseJobs's, tested with the packing
		// data; here only what joining the two files can find.
		{jobs: "jobs-unknown-job.csv", want: `jobs-unknown-job.csv:5: job "huge" has no row in job-types.csv`},
		{jobs: "jobs-missing-gpu.csv", want: `job-types.csv:3: job "tiny" has no throughput on gpu "p100" in jobs-missing-gpu.csv`},
		{jobTypes: "job-types-long-row.csv", want: `job-types-long-row.csv:2: 4 columns, want 3 (job,sm_pct,mem_pct)`},
		{jobTypes: "job-types-nan.csv", want: `job-types-nan.csv:2: column sm_pct: "ten" is not a number`},
		{jobTypes: "job-types-range.csv", want: `job-types-range.csv:2: column mem_pct: "108" is outside [0, 100]`},
		{jobTypes: "job-types-duplicate.csv", want: `job-types-duplicate.csv:4: job "tiny" repeats line 2`},
		{jobTypes: "job-types-none.csv", want: `job-types-none.csv: no job types`},
	} {
		t.Run(tc.jobs+tc.jobTypes, func(t *testing.T) {
			jobs, jobTypes := filepath.Join(handMadeJobTypes, "jobs.csv"), filepath.Join(handMadeJobTypes, "job-types.csv")
			if tc.jobs != "" {
				jobs = filepath.Join(handMadeJobTypes, "bad", tc.jobs)
			}
			if tc.jobTypes != "" {
				jobTypes = filepath.Join(handMadeJobTypes, "bad", tc.jobTypes)
			}
			_, err := ReadJobTypes(jobs, jobTypes)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestClassifierLabelsOfTheShippedJobTypes(t *testing.T) {
	types := shippedJobTypes(t)
	got := map[prismv1alpha1.BoundType]int{}
	some := map[string]prismv1alpha1.BoundType{}
	for _, ty := range types {
		got[ty.Bound()]++
		some[ty.Name] = ty.Bound()
	}
	// The counts docs/simulator.md states.
	want := map[prismv1alpha1.BoundType]int{
		prismv1alpha1.BoundTypeComputeBound: 10,
		prismv1alpha1.BoundTypeMemoryBound:  10,
		prismv1alpha1.BoundTypeLatencyBound: 5,
		prismv1alpha1.BoundTypeBalanced:     1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("labels per class (-want +got):\n%s", diff)
	}
	for name, w := range map[string]prismv1alpha1.BoundType{
		"A3C":                         prismv1alpha1.BoundTypeLatencyBound,
		"ResNet-50 (batch size 128)":  prismv1alpha1.BoundTypeComputeBound,
		"LM (batch size 20)":          prismv1alpha1.BoundTypeMemoryBound,
		"Transformer (batch size 32)": prismv1alpha1.BoundTypeBalanced,
	} {
		if some[name] != w {
			t.Errorf("%s: classified %q, want %s", name, some[name], w)
		}
	}
}
