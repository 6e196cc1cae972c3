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

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// The H100 rows come from hack/gpu-check.sh's records, committed beside
// the generated files: each job alone, then every pair, time-sliced and
// under MPS, and what the plugin's sampler read of each job alone.
const (
	h100GPU    = "h100"
	h100MPSGPU = "h100-mps"
)

// gpuCheckRun is one line of pairs/<mode>.jsonl: the jobs started together.
type gpuCheckRun struct {
	Mode string `json:"mode"`
	Jobs []struct {
		Job       string  `json:"job"`
		PerSecond float64 `json:"per_second"`
		Error     string  `json:"error"`
	} `json:"jobs"`
}

// gpuCheckUsage is one row of usage.json: the sampler's means over a job
// run alone.
type gpuCheckUsage struct {
	Job     string  `json:"job"`
	UtilPct float64 `json:"util_pct"`
	SMPct   float64 `json:"sm_pct"`
	DRAMPct float64 `json:"dram_pct"`
	MemMiB  float64 `json:"mem_mib"`
}

// h100Rows turns the records in dir into jobs.csv and pairs.csv rows. Both
// modes are rated against the job alone without MPS, so that the MPS rows
// carry MPS's own cost too.
func h100Rows(dir string) (jobs, pairs []string, err error) {
	sliced, err := readRuns(filepath.Join(dir, "timesliced.jsonl"))
	if err != nil {
		return nil, nil, err
	}
	mps, err := readRuns(filepath.Join(dir, "mps.jsonl"))
	if err != nil {
		return nil, nil, err
	}
	var usage []gpuCheckUsage
	raw, err := os.ReadFile(filepath.Join(dir, "usage.json"))
	if err != nil {
		return nil, nil, err
	}
	if err := json.Unmarshal(raw, &usage); err != nil {
		return nil, nil, fmt.Errorf("usage.json: %w", err)
	}

	alone := map[string]float64{}
	var order []string
	for _, r := range sliced {
		if len(r.Jobs) == 1 {
			alone[r.Jobs[0].Job] = r.Jobs[0].PerSecond
			order = append(order, r.Jobs[0].Job)
		}
	}
	for _, gpu := range []string{h100GPU, h100MPSGPU} {
		for _, u := range usage {
			a, ok := alone[u.Job]
			if !ok {
				return nil, nil, fmt.Errorf("usage.json: job %q was not run alone", u.Job)
			}
			jobs = append(jobs, fmt.Sprintf("%s,%s,%s,%s,%s,%s,%s", quote(u.Job), gpu, num(a),
				num1(u.UtilPct), num1(u.SMPct), num1(u.DRAMPct), num1(u.MemMiB)))
		}
	}
	for _, set := range []struct {
		gpu  string
		runs []gpuCheckRun
	}{{h100GPU, sliced}, {h100MPSGPU, mps}} {
		for _, r := range set.runs {
			if len(r.Jobs) != 2 {
				continue
			}
			a, b := r.Jobs[0], r.Jobs[1]
			if a.Error != "" || b.Error != "" {
				return nil, nil, fmt.Errorf("%s pair %s+%s failed: %s%s", set.gpu, a.Job, b.Job, a.Error, b.Error)
			}
			pairs = append(pairs, fmt.Sprintf("%s,%s,%s,%.4f,%.4f", quote(a.Job), quote(b.Job), set.gpu,
				a.PerSecond/alone[a.Job], b.PerSecond/alone[b.Job]))
		}
	}
	if len(order) != len(usage) {
		return nil, nil, fmt.Errorf("%d jobs alone, %d with usage", len(order), len(usage))
	}
	return jobs, pairs, nil
}

func readRuns(path string) ([]gpuCheckRun, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var runs []gpuCheckRun
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var r gpuCheckRun
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, line, err)
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

func num(v float64) string  { return strconv.FormatFloat(v, 'g', 6, 64) }
func num1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
