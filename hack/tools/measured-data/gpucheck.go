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
	"math"
	"os"
	"path/filepath"
	"strconv"
)

// The H100 and H200 rows come from hack/gpu-check.sh's records, committed
// beside the generated files: each job alone, then every pair in each way
// the run shared the GPU, and (H100) what the plugin's sampler read of
// each job alone.

// gpuCheckMode is one way the pairs shared the GPU: the record file
// (<mode>.jsonl, the "mode" of its lines) and what its rows append to the
// GPU model's name in the gpu column.
type gpuCheckMode struct{ mode, suffix string }

var (
	timeSliced = gpuCheckMode{"timesliced", ""}
	// oneDaemon: one MPS control daemon, no limits set.
	oneDaemon = gpuCheckMode{"mps", "-mps"}
	// daemonPerShare: each job in a share of its own, a control daemon per
	// share at 50 % active threads (the step pairs-limited).
	daemonPerShare = gpuCheckMode{"limited", "-mps-shares"}
)

// gpuCheckRecords is one GPU's records: the directory, the GPU model, the
// modes whose pairs become rows and whether usage.json holds the sampler's
// figures of each job alone.
type gpuCheckRecords struct {
	dir, gpu string
	modes    []gpuCheckMode
	usage    bool
}

func h100Records(dir string) gpuCheckRecords {
	return gpuCheckRecords{dir, "h100", []gpuCheckMode{timeSliced, oneDaemon}, true}
}

// h200Records leaves out the H200's pairs under one daemon: tinygrid, which
// is bound by launches, ran 1.27 times faster alone under MPS than alone
// without it, so two of its pairs read 1.31 and 1.39 of its speed alone,
// which the simulator refuses (a job beside another cannot run faster than
// alone); README.md says more.
func h200Records(dir string) gpuCheckRecords {
	return gpuCheckRecords{dir, "h200", []gpuCheckMode{timeSliced, daemonPerShare}, false}
}

// gpuCheckRun is one line of pairs/<mode>.jsonl: the jobs started together.
type gpuCheckRun struct {
	Mode string        `json:"mode"`
	Jobs []gpuCheckJob `json:"jobs"`
}

// gpuCheckJob is what one job's process reported.
type gpuCheckJob struct {
	Job            string  `json:"job"`
	PerSecond      float64 `json:"per_second"`
	BytesPerLaunch float64 `json:"bytes_per_launch"`
	FlopsPerLaunch float64 `json:"flops_per_launch"`
	Error          string  `json:"error"`
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

// gpuCheckRows turns a GPU's records into jobs.csv and pairs.csv rows.
// Every mode is rated against the job alone time-sliced (without MPS), so
// that the MPS rows carry MPS's own cost too. Without usage.json the jobs
// rows have the throughput alone and no utilisation.
func gpuCheckRows(rec gpuCheckRecords) (jobs, pairs []string, err error) {
	runs := map[gpuCheckMode][]gpuCheckRun{}
	for _, m := range rec.modes {
		if runs[m], err = readRuns(filepath.Join(rec.dir, m.mode+".jsonl"), m.mode); err != nil {
			return nil, nil, err
		}
	}
	if _, ok := runs[timeSliced]; !ok {
		return nil, nil, fmt.Errorf("no time-sliced records: the jobs alone are read from them")
	}
	alone := map[string]gpuCheckJob{}
	var order []string
	for _, r := range runs[timeSliced] {
		if len(r.Jobs) == 1 {
			if r.Jobs[0].Error != "" {
				return nil, nil, fmt.Errorf("%s alone failed: %s", r.Jobs[0].Job, r.Jobs[0].Error)
			}
			alone[r.Jobs[0].Job] = r.Jobs[0]
			order = append(order, r.Jobs[0].Job)
		}
	}
	figures := map[string]string{}
	if rec.usage {
		var usage []gpuCheckUsage
		raw, err := os.ReadFile(filepath.Join(rec.dir, "usage.json"))
		if err != nil {
			return nil, nil, err
		}
		if err := json.Unmarshal(raw, &usage); err != nil {
			return nil, nil, fmt.Errorf("usage.json: %w", err)
		}
		if len(order) != len(usage) {
			return nil, nil, fmt.Errorf("%d jobs alone, %d with usage", len(order), len(usage))
		}
		order = order[:0]
		for _, u := range usage {
			if _, ok := alone[u.Job]; !ok {
				return nil, nil, fmt.Errorf("usage.json: job %q was not run alone", u.Job)
			}
			order = append(order, u.Job)
			figures[u.Job] = fmt.Sprintf("%s,%s,%s,%s", num1(u.UtilPct), num1(u.SMPct), num1(u.DRAMPct), num1(u.MemMiB))
		}
	}
	for _, m := range rec.modes {
		for _, job := range order {
			f, ok := figures[job]
			if !ok {
				f = ",,,"
			}
			jobs = append(jobs, fmt.Sprintf("%s,%s,%s,%s", quote(job), rec.gpu+m.suffix, num(alone[job].PerSecond), f))
		}
	}
	for _, m := range rec.modes {
		gpu := rec.gpu + m.suffix
		for _, r := range runs[m] {
			if len(r.Jobs) != 2 {
				continue
			}
			a, b := r.Jobs[0], r.Jobs[1]
			if a.Error != "" || b.Error != "" {
				return nil, nil, fmt.Errorf("%s pair %s+%s failed: %s%s", gpu, a.Job, b.Job, a.Error, b.Error)
			}
			sa, err := speed(a, alone)
			if err != nil {
				return nil, nil, fmt.Errorf("%s pair %s+%s: %w", gpu, a.Job, b.Job, err)
			}
			sb, err := speed(b, alone)
			if err != nil {
				return nil, nil, fmt.Errorf("%s pair %s+%s: %w", gpu, a.Job, b.Job, err)
			}
			pairs = append(pairs, fmt.Sprintf("%s,%s,%s,%.4f,%.4f", quote(a.Job), quote(b.Job), gpu, sa, sb))
		}
	}
	return jobs, pairs, nil
}

// speed is a job's work per second beside another over its work per second
// alone. Work, not launches: fmaloop sizes its grid from the SMs its
// process sees (hack/gpu-check/kernels.cu, setup), so under an MPS thread
// limit each of its launches does half the work. A launch's work is its
// bytes, which every job moves; its flops must have scaled alike.
func speed(j gpuCheckJob, alone map[string]gpuCheckJob) (float64, error) {
	a, ok := alone[j.Job]
	if !ok {
		return 0, fmt.Errorf("%s was not run alone", j.Job)
	}
	if a.BytesPerLaunch <= 0 {
		return 0, fmt.Errorf("%s alone moved no bytes per launch", j.Job)
	}
	scale := j.BytesPerLaunch / a.BytesPerLaunch
	if flops := j.FlopsPerLaunch / a.FlopsPerLaunch; (a.FlopsPerLaunch == 0 && j.FlopsPerLaunch != 0) ||
		(a.FlopsPerLaunch != 0 && math.Abs(flops-scale) > 1e-9*scale) {
		return 0, fmt.Errorf("%s's launches moved %g of the bytes of its launches alone but did %g of the flops", j.Job, scale, flops)
	}
	return j.PerSecond * j.BytesPerLaunch / (a.PerSecond * a.BytesPerLaunch), nil
}

// readRuns reads a record file whose lines are all of one mode.
func readRuns(path, mode string) ([]gpuCheckRun, error) {
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
		if r.Mode != mode {
			return nil, fmt.Errorf("%s:%d: mode %q, want %q", path, line, r.Mode, mode)
		}
		runs = append(runs, r)
	}
	return runs, sc.Err()
}

func num(v float64) string  { return strconv.FormatFloat(v, 'g', 6, 64) }
func num1(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }
