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
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func readHandMade(t *testing.T) *Measured {
	t.Helper()
	dir := filepath.Join("testdata", "measured")
	m, err := ReadMeasured(filepath.Join(dir, "jobs.csv"), filepath.Join(dir, "pairs.csv"), filepath.Join(dir, "slices.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestReadMeasuredKeepsEveryFigureAndMarksTheUnknown(t *testing.T) {
	m := readHandMade(t)
	nan := math.NaN()
	want := &Measured{
		Jobs: []MeasuredJob{
			{Job: "light", GPU: "t1", Throughput: 10, UtilPct: 20, SMPct: nan, DRAMPct: nan, MemMiB: 2000, Line: 4},
			{Job: "medium", GPU: "t1", Throughput: 5, UtilPct: 50, SMPct: 40, DRAMPct: 30, MemMiB: 6000, Line: 5},
			{Job: "heavy", GPU: "t1", Throughput: 2, UtilPct: 95, SMPct: nan, DRAMPct: nan, MemMiB: 12000, Line: 6},
			{Job: "name, with comma", GPU: "t2", Throughput: 1, UtilPct: nan, SMPct: nan, DRAMPct: nan, MemMiB: nan, Line: 7},
		},
		Pairs: []PairSpeed{
			{JobA: "light", JobB: "light", GPU: "t1", SpeedA: 0.95, SpeedB: 0.95, Line: 3},
			{JobA: "light", JobB: "medium", GPU: "t1", SpeedA: 0.9, SpeedB: 0.85, Line: 4},
			{JobA: "light", JobB: "heavy", GPU: "t1", SpeedA: 0.85, SpeedB: 0.9, Line: 5},
			{JobA: "medium", JobB: "medium", GPU: "t1", SpeedA: 0.7, SpeedB: 0.7, Line: 6},
			{JobA: "medium", JobB: "heavy", GPU: "t1", SpeedA: 0.5, SpeedB: 0.6, Line: 7},
			{JobA: "heavy", JobB: "heavy", GPU: "t1", Line: 8},
		},
		Slices: []SliceSpeed{
			{Job: "light", GPU: "t1", Slice: "1g.5gb", Speed: 0.8, Line: 2},
			{Job: "heavy", GPU: "t1", Slice: "1g.5gb", Speed: 0.15, Line: 3},
			{Job: "medium", GPU: "t1", Slice: "1g.5gb", Speed: nan, Line: 5},
		},
	}
	if diff := cmp.Diff(want, m, cmpopts.EquateNaNs()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestMalformedFilesAreNamedByFileLineAndColumn(t *testing.T) {
	for file, want := range map[string]string{
		"jobs-throughput-nan.csv":    `jobs-throughput-nan.csv:2: column throughput: "x" is not a number`,
		"jobs-util-range.csv":        `jobs-util-range.csv:3: column util_pct: "120" is outside [0, 100]`,
		"jobs-throughput-zero.csv":   `jobs-throughput-zero.csv:2: column throughput: "0" is not a throughput above 0`,
		"jobs-empty-name.csv":        `jobs-empty-name.csv:2: column job: "" is empty`,
		"jobs-header.csv":            `jobs-header.csv:1: header is job,gpu,throughput,util_pct,sm_pct,dram_pct, want job,gpu,throughput,util_pct,sm_pct,dram_pct,mem_mib`,
		"jobs-short-row.csv":         `jobs-short-row.csv:2: 6 columns, want 7`,
		"jobs-duplicate.csv":         `jobs-duplicate.csv:4: job "a" on gpu "t1" repeats line 2`,
		"jobs-empty.csv":             `jobs-empty.csv: empty, want the header`,
		"pairs-speed-nan.csv":        `pairs-speed-nan.csv:5: pair "b", "a" on gpu "t1": column speed_b: "x" is not a number`,
		"pairs-duplicate.csv":        `pairs-duplicate.csv:3: pair "b", "a" on gpu "t1" repeats line 2`,
		"pairs-negative.csv":         `pairs-negative.csv:2: pair "a", "b" on gpu "t1": column speed_a: "-0.1" is outside [0, 1]`,
		"pairs-above-one.csv":        `pairs-above-one.csv:2: pair "light", "medium" on gpu "t1": column speed_a: "1.2" is above 1: a job beside another cannot run faster than alone (up to 1.01 is taken as measurement noise and read as 1)`,
		"slices-above-one.csv":       `slices-above-one.csv:2: job "a" on gpu "t1" slice "1g.5gb": column speed: "1.02" is above 1: a job on a slice cannot run faster than on the whole GPU (up to 1.01 is taken as measurement noise and read as 1)`,
		"pairs-quote.csv":            `pairs-quote.csv:2: extraneous or missing " in quoted-field`,
		"pairs-speed-half-empty.csv": `pairs-speed-half-empty.csv:2: pair "light", "medium" on gpu "t1": column speed_b: "" is empty and speed_a is not: a pair is measured for both jobs or not at all (both empty)`,
	} {
		t.Run(file, func(t *testing.T) {
			f, err := os.Open(filepath.Join("testdata", "measured", "bad", file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			switch {
			case strings.HasPrefix(file, "jobs"):
				_, err = ParseJobs(f, file)
			case strings.HasPrefix(file, "pairs"):
				_, err = ParsePairs(f, file)
			default:
				_, err = ParseSlices(f, file)
			}
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v, want it to contain %q", err, want)
			}
		})
	}
}

func TestAPairOfAJobNeverMeasuredAloneIsRejected(t *testing.T) {
	dir := t.TempDir()
	jobs := filepath.Join(dir, "jobs.csv")
	pairs := filepath.Join(dir, "pairs.csv")
	os.WriteFile(jobs, []byte("job,gpu,throughput,util_pct,sm_pct,dram_pct,mem_mib\na,t1,1,,,,\n"), 0o644)
	os.WriteFile(pairs, []byte("job_a,job_b,gpu,speed_a,speed_b\na,b,t1,0.9,0.9\n"), 0o644)
	_, err := ReadMeasured(jobs, pairs, "")
	if want := `pairs.csv:2: job "b" on gpu "t1" has no row in the jobs file`; err == nil || err.Error() != want {
		t.Errorf("error %v, want %q", err, want)
	}
}

// A speed cell is a figure, 0 (the job did not fit), or empty: nobody
// measured it, which the judge tells apart from did not fit. A figure above
// 1 + SpeedTolerance is refused, naming the file, the line, the pair or
// slice and the figure.
func TestSpeedCellsTellNotMeasuredFromDidNotFit(t *testing.T) {
	nan := math.NaN()
	type speeds struct {
		Speeds []float64
		Err    string
	}
	for _, tc := range []struct {
		name, pairs, slices string
		want                speeds
	}{{
		name:  "a pair not measured",
		pairs: "a,b,t1,,",
		want:  speeds{Speeds: []float64{nan, nan}},
	}, {
		name:  "a pair that did not fit",
		pairs: "a,b,t1,0,0",
		want:  speeds{Speeds: []float64{0, 0}},
	}, {
		name:  "a pair half measured",
		pairs: "a,b,t1,,0.5",
		want:  speeds{Err: `pairs.csv:2: pair "a", "b" on gpu "t1": column speed_a: "" is empty and speed_b is not: a pair is measured for both jobs or not at all (both empty)`},
	}, {
		name:  "a pair at the tolerance",
		pairs: "a,b,t1,1.01,0.5",
		want:  speeds{Speeds: []float64{1, 0.5}},
	}, {
		name:  "a pair just above the tolerance",
		pairs: "a,b,t1,0.5,1.0101",
		want:  speeds{Err: `pairs.csv:2: pair "a", "b" on gpu "t1": column speed_b: "1.0101" is above 1: a job beside another cannot run faster than alone (up to 1.01 is taken as measurement noise and read as 1)`},
	}, {
		name:   "a slice not measured",
		slices: "a,t1,1g.5gb,",
		want:   speeds{Speeds: []float64{nan}},
	}, {
		name:   "a slice the job did not fit",
		slices: "a,t1,1g.5gb,0",
		want:   speeds{Speeds: []float64{0}},
	}, {
		name:   "a slice just above the tolerance",
		slices: "a,t1,1g.5gb,1.0101",
		want:   speeds{Err: `slices.csv:2: job "a" on gpu "t1" slice "1g.5gb": column speed: "1.0101" is above 1: a job on a slice cannot run faster than on the whole GPU (up to 1.01 is taken as measurement noise and read as 1)`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var got speeds
			var err error
			if tc.pairs != "" {
				var ps []PairSpeed
				ps, err = ParsePairs(strings.NewReader("job_a,job_b,gpu,speed_a,speed_b\n"+tc.pairs+"\n"), "pairs.csv")
				for _, p := range ps {
					got.Speeds = append(got.Speeds, p.SpeedA, p.SpeedB)
				}
			} else {
				var ss []SliceSpeed
				ss, err = ParseSlices(strings.NewReader("job,gpu,slice,speed\n"+tc.slices+"\n"), "slices.csv")
				for _, s := range ss {
					got.Speeds = append(got.Speeds, s.Speed)
				}
			}
			if err != nil {
				got = speeds{Err: err.Error()}
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateNaNs()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A speed above 1 by no more than SpeedTolerance is measurement noise: it
// reads as 1 and is named, so that the report can say so. A speed of 0 on
// a slice is a job that did not fit there.
func TestSpeedsAboveOneWithinTheToleranceReadAsOne(t *testing.T) {
	for _, tc := range []struct {
		name, csv string
		want      []PairSpeed
	}{{
		name: "within the tolerance",
		csv:  "job_a,job_b,gpu,speed_a,speed_b\na,b,t1,1.004,0.5\na,a,t1,0.5,1.01\n",
		want: []PairSpeed{
			{JobA: "a", JobB: "b", GPU: "t1", SpeedA: 1, SpeedB: 0.5, Clamped: []string{"pairs.csv:2: speed_a 1.004"}, Line: 2},
			{JobA: "a", JobB: "a", GPU: "t1", SpeedA: 0.5, SpeedB: 1, Clamped: []string{"pairs.csv:3: speed_b 1.01"}, Line: 3},
		},
	}, {
		name: "1 and below are kept",
		csv:  "job_a,job_b,gpu,speed_a,speed_b\na,b,t1,1,0\n",
		want: []PairSpeed{{JobA: "a", JobB: "b", GPU: "t1", SpeedA: 1, SpeedB: 0, Line: 2}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePairs(strings.NewReader(tc.csv), "pairs.csv")
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	got, err := ParseSlices(strings.NewReader("job,gpu,slice,speed\na,t1,3g.20gb,1.0035\na,t1,1g.5gb,0\n"), "slices.csv")
	if err != nil {
		t.Fatal(err)
	}
	want := []SliceSpeed{
		{Job: "a", GPU: "t1", Slice: "3g.20gb", Speed: 1, Clamped: []string{"slices.csv:2: speed 1.0035"}, Line: 2},
		{Job: "a", GPU: "t1", Slice: "1g.5gb", Speed: 0, Line: 3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("slices (-want +got):\n%s", diff)
	}
}
