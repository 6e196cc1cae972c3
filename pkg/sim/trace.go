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
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// Job is one entry of a trace.
type Job struct {
	ID int
	// Arrival is seconds since the start of the trace.
	Arrival float64
	GPUs    int
	// Runtime is seconds on one reference GPU per GPU (ReferenceProduct).
	Runtime float64
	Bound   rewrite.BoundType
	// SMPct and MemPct are measured SM and DRAM throughput in percent of
	// peak; HasUtil says whether the trace gave them.
	SMPct, MemPct float64
	HasUtil       bool
}

// ParseBound accepts the API names (MemoryBound) and short ones (memory).
func ParseBound(s string) (rewrite.BoundType, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "memory", "memorybound", "memory-bound":
		return rewrite.MemoryBound, nil
	case "compute", "computebound", "compute-bound":
		return rewrite.ComputeBound, nil
	case "latency", "latencybound", "latency-bound":
		return rewrite.LatencyBound, nil
	case "balanced":
		return rewrite.Balanced, nil
	case "unknown", "":
		return rewrite.Unknown, nil
	}
	return "", fmt.Errorf("unknown bound type %q", s)
}

func shortBound(b rewrite.BoundType) string {
	switch b {
	case rewrite.MemoryBound:
		return "memory"
	case rewrite.ComputeBound:
		return "compute"
	case rewrite.LatencyBound:
		return "latency"
	case rewrite.Balanced:
		return "balanced"
	}
	return "unknown"
}

func newCSVReader(r io.Reader) *csv.Reader {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	return cr
}

// ParseNative reads the native trace format,
// arrival_s,gpus,runtime_s,bound_type[,sm_pct,mem_pct], one job a line.
// A header line and lines starting with # are skipped. Jobs are returned
// sorted by arrival (stable), with IDs in that order.
func ParseNative(r io.Reader) ([]*Job, error) {
	cr := newCSVReader(r)
	var jobs []*Job
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if line == 1 && len(rec) > 0 && strings.TrimSpace(rec[0]) == "arrival_s" {
			continue
		}
		ln, _ := cr.FieldPos(0)
		if len(rec) != 4 && len(rec) != 6 {
			return nil, fmt.Errorf("line %d: want 4 or 6 fields, got %d", ln, len(rec))
		}
		j := &Job{}
		var errs []error
		num := func(i int) float64 {
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[i]), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				errs = append(errs, fmt.Errorf("field %d %q: not a non-negative number", i+1, rec[i]))
			}
			return v
		}
		j.Arrival = num(0)
		g := num(1)
		j.Runtime = num(2)
		if g < 1 || g != math.Trunc(g) {
			errs = append(errs, fmt.Errorf("gpus %q: must be a positive integer", rec[1]))
		}
		j.GPUs = int(g)
		if j.Bound, err = ParseBound(rec[3]); err != nil {
			errs = append(errs, err)
		}
		if len(rec) == 6 && (strings.TrimSpace(rec[4]) != "" || strings.TrimSpace(rec[5]) != "") {
			j.SMPct, j.MemPct, j.HasUtil = num(4), num(5), true
		}
		if len(errs) > 0 {
			return nil, fmt.Errorf("line %d: %w", ln, errors.Join(errs...))
		}
		jobs = append(jobs, j)
	}
	sortJobs(jobs)
	return jobs, nil
}

func sortJobs(jobs []*Job) {
	sort.SliceStable(jobs, func(a, b int) bool { return jobs[a].Arrival < jobs[b].Arrival })
	for i, j := range jobs {
		j.ID = i
	}
}

// WriteNative writes jobs in the native format with a header.
func WriteNative(w io.Writer, jobs []*Job) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"arrival_s", "gpus", "runtime_s", "bound_type", "sm_pct", "mem_pct"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	for _, j := range jobs {
		rec := []string{f(j.Arrival), strconv.Itoa(j.GPUs), f(j.Runtime), shortBound(j.Bound), "", ""}
		if j.HasUtil {
			rec[4], rec[5] = f(j.SMPct), f(j.MemPct)
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// BoundMix is a distribution of bound types, for traces without profiles.
type BoundMix []BoundShare

// BoundShare is one bound type's weight.
type BoundShare struct {
	Bound  rewrite.BoundType
	Weight float64
}

// ParseBoundMix reads "memory=0.4,compute=0.4,latency=0.2". Weights are
// normalised; the order of the string is kept, so a seed draws the same
// types for the same string.
func ParseBoundMix(s string) (BoundMix, error) {
	var m BoundMix
	var total float64
	for part := range strings.SplitSeq(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return nil, fmt.Errorf("bound mix %q: %q is not type=weight", s, part)
		}
		b, err := ParseBound(k)
		if err != nil {
			return nil, fmt.Errorf("bound mix: %w", err)
		}
		w, err := strconv.ParseFloat(v, 64)
		if err != nil || w < 0 || math.IsNaN(w) || math.IsInf(w, 0) {
			return nil, fmt.Errorf("bound mix %q: weight %q is not a non-negative number", s, v)
		}
		if slices.ContainsFunc(m, func(x BoundShare) bool { return x.Bound == b }) {
			return nil, fmt.Errorf("bound mix %q: %s given twice", s, k)
		}
		m = append(m, BoundShare{b, w})
		total += w
	}
	if total <= 0 {
		return nil, fmt.Errorf("bound mix %q: weights sum to zero", s)
	}
	for i := range m {
		m[i].Weight /= total
	}
	return m, nil
}

func (m BoundMix) String() string {
	parts := make([]string, len(m))
	for i, s := range m {
		parts[i] = fmt.Sprintf("%s=%.3g", shortBound(s.Bound), s.Weight)
	}
	return strings.Join(parts, ",")
}

func (m BoundMix) draw(r *rand.Rand) rewrite.BoundType {
	x := r.Float64()
	for _, s := range m {
		if x < s.Weight {
			return s.Bound
		}
		x -= s.Weight
	}
	return m[len(m)-1].Bound
}

// AlibabaStats says what ParseAlibaba kept and skipped.
type AlibabaStats struct {
	Rows, Kept, NoGPU, NoTimes, Fractional int
}

// ParseAlibaba reads the pod list of Alibaba's public GPU cluster trace
// (cluster-trace-gpu-v2023: name,cpu_milli,memory_mib,num_gpu,gpu_milli,
// gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time).
// Arrival is creation_time, shifted so the first job arrives at 0; runtime
// is deletion_time - scheduled_time; rows without those times, or with no
// GPU, are skipped; a fractional GPU (gpu_milli < 1000) counts as one
// whole GPU. The trace carries no profiles, so each job's bound type is
// drawn from mix with a generator seeded by seed.
func ParseAlibaba(r io.Reader, mix BoundMix, seed uint64) ([]*Job, AlibabaStats, error) {
	var st AlibabaStats
	if len(mix) == 0 {
		return nil, st, fmt.Errorf("alibaba trace: a bound mix is required")
	}
	cr := newCSVReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, st, fmt.Errorf("alibaba trace: reading header: %w", err)
	}
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	for _, want := range []string{"num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time"} {
		if _, ok := col[want]; !ok {
			return nil, st, fmt.Errorf("alibaba trace: header has no %s column", want)
		}
	}
	rng := rand.New(rand.NewPCG(seed, 0x5157))
	var jobs []*Job
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, st, err
		}
		st.Rows++
		ln, _ := cr.FieldPos(0)
		get := func(name string) (float64, bool, error) {
			i := col[name]
			if i >= len(rec) || strings.TrimSpace(rec[i]) == "" {
				return 0, false, nil
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(rec[i]), 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return 0, false, fmt.Errorf("alibaba trace line %d: %s %q is not a number", ln, name, rec[i])
			}
			return v, true, nil
		}
		var vals [5]float64
		var have [5]bool
		for i, name := range []string{"num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time"} {
			if vals[i], have[i], err = get(name); err != nil {
				return nil, st, err
			}
		}
		numGPU, milli, created, deleted, scheduled := vals[0], vals[1], vals[2], vals[3], vals[4]
		if !have[0] || numGPU < 1 {
			st.NoGPU++
			continue
		}
		if !have[2] || !have[3] || !have[4] || deleted <= scheduled {
			st.NoTimes++
			continue
		}
		gpus := int(math.Ceil(numGPU))
		if have[1] && milli < 1000 {
			gpus = 1
			st.Fractional++
		}
		st.Kept++
		jobs = append(jobs, &Job{Arrival: created, GPUs: gpus, Runtime: deleted - scheduled})
	}
	sortJobs(jobs)
	if len(jobs) > 0 {
		first := jobs[0].Arrival
		for _, j := range jobs {
			j.Arrival -= first
		}
	}
	// Draw after sorting, so the types follow arrival order and do not
	// depend on the order of rows in the file.
	for _, j := range jobs {
		j.Bound = mix.draw(rng)
	}
	return jobs, st, nil
}

// GenerateConfig describes a synthetic trace.
type GenerateConfig struct {
	Jobs int
	Seed uint64
	// MeanInterarrival is the mean of the exponential gaps between
	// arrivals, seconds.
	MeanInterarrival float64
	// MedianRuntime is the median of the log-normal reference runtime,
	// seconds; RuntimeSigma its sigma (of the log).
	MedianRuntime, RuntimeSigma float64
	// Mix is the bound type distribution.
	Mix BoundMix
}

// DefaultGenerateConfig is what demo/sim/trace.csv was generated with,
// apart from Jobs and MeanInterarrival.
func DefaultGenerateConfig() GenerateConfig {
	mix, _ := ParseBoundMix("memory=0.35,compute=0.35,latency=0.2,balanced=0.1")
	return GenerateConfig{Jobs: 300, Seed: 1, MeanInterarrival: 40, MedianRuntime: 1200, RuntimeSigma: 1, Mix: mix}
}

// gpuCounts is the GPUs-per-job distribution of Generate: mostly single
// GPU, as in public cluster traces.
var gpuCounts = []struct {
	gpus   int
	weight float64
}{{1, 0.6}, {2, 0.15}, {4, 0.15}, {8, 0.1}}

// Generate draws a synthetic trace: Poisson arrivals, log-normal runtimes
// (capped at 50x the median), GPU counts from gpuCounts, bound types from
// Mix, and SM/memory throughput consistent with the bound type: the
// dominant unit at 60-95 %, the other at 10-40 %; latency-bound jobs both
// at 5-25 %; balanced both at 50-80 %. The same config gives the same
// trace.
func Generate(c GenerateConfig) []*Job {
	rng := rand.New(rand.NewPCG(c.Seed, 0x6a6f6273))
	u := func(lo, hi float64) float64 { return math.Round((lo+(hi-lo)*rng.Float64())*10) / 10 }
	jobs := make([]*Job, c.Jobs)
	t := 0.0
	for i := range jobs {
		t += rng.ExpFloat64() * c.MeanInterarrival
		rt := c.MedianRuntime * math.Exp(c.RuntimeSigma*rng.NormFloat64())
		rt = math.Min(rt, 50*c.MedianRuntime)
		x := rng.Float64()
		gpus := gpuCounts[len(gpuCounts)-1].gpus
		for _, g := range gpuCounts {
			if x < g.weight {
				gpus = g.gpus
				break
			}
			x -= g.weight
		}
		j := &Job{ID: i, Arrival: math.Round(t*10) / 10, GPUs: gpus, Runtime: math.Max(1, math.Round(rt)), Bound: c.Mix.draw(rng), HasUtil: true}
		switch j.Bound {
		case rewrite.MemoryBound:
			j.SMPct, j.MemPct = u(10, 40), u(60, 95)
		case rewrite.ComputeBound:
			j.SMPct, j.MemPct = u(60, 95), u(10, 40)
		case rewrite.LatencyBound:
			j.SMPct, j.MemPct = u(5, 25), u(5, 25)
		default:
			j.SMPct, j.MemPct = u(50, 80), u(50, 80)
		}
		jobs[i] = j
	}
	return jobs
}
