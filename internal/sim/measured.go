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
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// The measured-data files of the packing evaluation (docs/simulator.md,
// "Packing"). Each is CSV with a header row; lines starting with # are
// comments (the shipped files carry their citation there), and an empty
// cell is a figure nobody measured.
var (
	jobsHeader   = []string{"job", "gpu", "throughput", "util_pct", "sm_pct", "dram_pct", "mem_mib"}
	pairsHeader  = []string{"job_a", "job_b", "gpu", "speed_a", "speed_b"}
	slicesHeader = []string{"job", "gpu", "slice", "speed"}
)

// MeasuredJob is one job type measured alone on one GPU model: everything a
// packing policy may read. Optional figures are NaN when unknown.
type MeasuredJob struct {
	Job, GPU string
	// Throughput is in the source's unit (iterations per second); only
	// ratios on one GPU model are used.
	Throughput float64
	// UtilPct is the duty cycle (nvidia-smi utilization.gpu), SMPct the
	// SM activity, DRAMPct the memory-controller or DRAM activity, all in
	// per cent; MemMiB the memory used.
	UtilPct, SMPct, DRAMPct, MemMiB float64
	Line                            int
}

// PairSpeed is what two job types did when they shared one GPU, each as a
// fraction of its throughput alone, at most 1. Both 0 means the pair did
// not fit in memory; both NaN (empty cells) that nobody measured it, as
// if it had no row. Only the judge reads it.
type PairSpeed struct {
	JobA, JobB, GPU string
	SpeedA, SpeedB  float64
	// Clamped names each figure of the row that read above 1 within
	// SpeedTolerance and is taken as 1, as "pairs.csv:7: speed_a 1.004".
	Clamped []string
	Line    int
}

// SliceSpeed is a job type's speed on a MIG slice as a fraction of the
// whole GPU, at most 1; 0 means the job did not fit in the slice's memory,
// and NaN (an empty cell) that nobody measured it, as if it had no row.
// Only the judge reads it.
type SliceSpeed struct {
	Job, GPU, Slice string
	Speed           float64
	// Clamped names the figure when it read above 1 within SpeedTolerance
	// and is taken as 1, as "slices.csv:7: speed 1.004".
	Clamped []string
	Line    int
}

// SpeedTolerance is how far above 1 a measured speed may read and still be
// taken as noise. A job beside another cannot run faster than alone, nor
// on a MIG slice faster than on the whole GPU, but two timings of one job
// differ: in the H100 record a job alone under MPS read 1.007 of itself
// alone, and the shipped files hold speeds of 1.0004 and 1.0039
// (pairs.csv, h100-mps) and 1.0035 (slices.csv). Such a figure is read as
// 1 and the reports name it; one further above is refused.
const SpeedTolerance = 0.01

// Measured is the content of jobs.csv, pairs.csv and (optionally)
// slices.csv.
type Measured struct {
	Jobs   []MeasuredJob
	Pairs  []PairSpeed
	Slices []SliceSpeed
}

// Known says whether an optional figure was measured.
func Known(v float64) bool { return !math.IsNaN(v) }

// ReadMeasured reads the three files; pairsPath or slicesPath may be empty
// (the packing evaluation needs pairs, the MIG sizing evaluation slices).
// Errors name the file, the line and the column.
func ReadMeasured(jobsPath, pairsPath, slicesPath string) (*Measured, error) {
	var m Measured
	var err error
	if m.Jobs, err = readCSVFile(jobsPath, ParseJobs); err != nil {
		return nil, err
	}
	if pairsPath != "" {
		if m.Pairs, err = readCSVFile(pairsPath, ParsePairs); err != nil {
			return nil, err
		}
	}
	if slicesPath != "" {
		if m.Slices, err = readCSVFile(slicesPath, ParseSlices); err != nil {
			return nil, err
		}
	}
	if err := m.check(filepath.Base(pairsPath), filepath.Base(slicesPath)); err != nil {
		return nil, err
	}
	return &m, nil
}

func readCSVFile[T any](path string, parse func(io.Reader, string) ([]T, error)) ([]T, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parse(f, filepath.Base(path))
}

// check cross-references the files: every pair and slice names a job type
// measured alone on that GPU model, so that the judge never rates a job the
// policies could not see.
func (m *Measured) check(pairsName, slicesName string) error {
	alone := map[[2]string]bool{}
	for _, j := range m.Jobs {
		alone[[2]string{j.Job, j.GPU}] = true
	}
	for _, p := range m.Pairs {
		for _, j := range []string{p.JobA, p.JobB} {
			if !alone[[2]string{j, p.GPU}] {
				return fmt.Errorf("%s:%d: job %q on gpu %q has no row in the jobs file", pairsName, p.Line, j, p.GPU)
			}
		}
	}
	for _, s := range m.Slices {
		if !alone[[2]string{s.Job, s.GPU}] {
			return fmt.Errorf("%s:%d: job %q on gpu %q has no row in the jobs file", slicesName, s.Line, s.Job, s.GPU)
		}
	}
	return nil
}

// ParseJobs reads jobs.csv; name is the file name errors carry.
func ParseJobs(r io.Reader, name string) ([]MeasuredJob, error) {
	return parseKeyedCSV(r, name, jobsHeader, func(c *cells) (MeasuredJob, [2]string, string) {
		j := MeasuredJob{Job: c.text(0), GPU: c.text(1), Line: c.line}
		j.Throughput = c.number(2, false, 0, math.Inf(1))
		j.UtilPct = c.number(3, true, 0, 100)
		j.SMPct = c.number(4, true, 0, 100)
		j.DRAMPct = c.number(5, true, 0, 100)
		j.MemMiB = c.number(6, true, 0, math.Inf(1))
		if c.err == nil && j.Throughput == 0 {
			c.fail(2, "is not a throughput above 0")
		}
		return j, [2]string{j.Job, j.GPU}, fmt.Sprintf("job %q on gpu %q", j.Job, j.GPU)
	})
}

// ParsePairs reads pairs.csv. A pair is unordered: (a, b) and (b, a) on one
// GPU model may not both appear. A pair not measured has both speeds empty
// or no row; one speed empty is refused, since the judge needs both.
func ParsePairs(r io.Reader, name string) ([]PairSpeed, error) {
	return parseKeyedCSV(r, name, pairsHeader, func(c *cells) (PairSpeed, [3]string, string) {
		p := PairSpeed{JobA: c.text(0), JobB: c.text(1), GPU: c.text(2), Line: c.line}
		c.row = fmt.Sprintf("pair %q, %q on gpu %q", p.JobA, p.JobB, p.GPU)
		const why = "a job beside another cannot run faster than alone"
		p.SpeedA = c.speed(3, why, &p.Clamped)
		p.SpeedB = c.speed(4, why, &p.Clamped)
		switch {
		case Known(p.SpeedA) && !Known(p.SpeedB):
			c.fail(4, "is empty and speed_a is not: a pair is measured for both jobs or not at all (both empty)")
		case !Known(p.SpeedA) && Known(p.SpeedB):
			c.fail(3, "is empty and speed_b is not: a pair is measured for both jobs or not at all (both empty)")
		}
		a, b := p.JobA, p.JobB
		if b < a {
			a, b = b, a
		}
		return p, [3]string{a, b, p.GPU}, c.row
	})
}

// ParseSlices reads slices.csv: a speed of 0 says the job did not fit in
// the slice; an empty speed, or no row, that nobody measured it.
func ParseSlices(r io.Reader, name string) ([]SliceSpeed, error) {
	return parseKeyedCSV(r, name, slicesHeader, func(c *cells) (SliceSpeed, [3]string, string) {
		s := SliceSpeed{Job: c.text(0), GPU: c.text(1), Slice: c.text(2), Line: c.line}
		c.row = fmt.Sprintf("job %q on gpu %q slice %q", s.Job, s.GPU, s.Slice)
		s.Speed = c.speed(3, "a job on a slice cannot run faster than on the whole GPU", &s.Clamped)
		return s, [3]string{s.Job, s.GPU, s.Slice}, c.row
	})
}

// cells is one record being parsed; the first bad cell sticks in err.
type cells struct {
	name   string
	header []string
	rec    []string
	line   int
	// row names what the record is about, once its key cells are read, so
	// that an error in a figure says whose figure it is.
	row string
	err error
}

// parseKeyedCSV reads a CSV file whose rows each have a key that may
// stand on one line only. row reads a line's cells into a row, its key and
// what names the key in the error when it stood on an earlier line.
func parseKeyedCSV[T any, K comparable](r io.Reader, name string, header []string, row func(*cells) (T, K, string)) ([]T, error) {
	var out []T
	seen := map[K]int{}
	err := parseCSV(r, name, header, func(c *cells) error {
		t, key, what := row(c)
		if prev, ok := seen[key]; ok && c.err == nil {
			return fmt.Errorf("%s:%d: %s repeats line %d", c.name, c.line, what, prev)
		}
		seen[key] = c.line
		out = append(out, t)
		return c.err
	})
	return out, err
}

func (c *cells) fail(col int, format string, args ...any) {
	if c.err != nil {
		return
	}
	where := fmt.Sprintf("%s:%d", c.name, c.line)
	if c.row != "" {
		where += ": " + c.row
	}
	c.err = fmt.Errorf("%s: column %s: %q %s", where, c.header[col], c.rec[col], fmt.Sprintf(format, args...))
}

func (c *cells) text(col int) string {
	v := strings.TrimSpace(c.rec[col])
	if v == "" {
		c.fail(col, "is empty")
	}
	return v
}

// number parses a cell within [lo, hi]; an empty optional cell is NaN.
func (c *cells) number(col int, optional bool, lo, hi float64) float64 {
	s := strings.TrimSpace(c.rec[col])
	if s == "" && optional {
		return math.NaN()
	}
	v, err := strconv.ParseFloat(s, 64)
	switch {
	case err != nil || math.IsNaN(v):
		c.fail(col, "is not a number")
	case v < lo || v > hi:
		c.fail(col, "is outside [%g, %g]", lo, hi)
	}
	return v
}

// speed parses a speed cell, a fraction of a reference speed within [0, 1],
// or NaN where it is empty: not measured. A figure above 1 by at most
// SpeedTolerance is noise: it reads as 1 and is named in clamped. A figure
// further above is refused, with why.
func (c *cells) speed(col int, why string, clamped *[]string) float64 {
	const most = 1 + SpeedTolerance
	v := c.number(col, true, math.Inf(-1), math.Inf(1))
	switch {
	case c.err != nil || !Known(v):
	case v < 0:
		c.fail(col, "is outside [0, 1]")
	case v > most:
		c.fail(col, "is above 1: %s (up to %g is taken as measurement noise and read as 1)", why, most)
	case v > 1:
		*clamped = append(*clamped, fmt.Sprintf("%s:%d: %s %s", c.name, c.line, c.header[col], strings.TrimSpace(c.rec[col])))
		return 1
	}
	return v
}

func parseCSV(r io.Reader, name string, header []string, row func(*cells) error) error {
	cr := csv.NewReader(r)
	cr.Comment = '#'
	cr.FieldsPerRecord = -1
	first := true
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			if first {
				return fmt.Errorf("%s: empty, want the header %s", name, strings.Join(header, ","))
			}
			return nil
		}
		line, _ := cr.FieldPos(0)
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return fmt.Errorf("%s:%d: %v", name, pe.Line, pe.Err)
			}
			return fmt.Errorf("%s: %w", name, err)
		}
		if first {
			first = false
			got := make([]string, len(rec))
			for i, h := range rec {
				got[i] = strings.TrimSpace(h)
			}
			if !slices.Equal(got, header) {
				return fmt.Errorf("%s:%d: header is %s, want %s", name, line, strings.Join(got, ","), strings.Join(header, ","))
			}
			continue
		}
		if len(rec) != len(header) {
			return fmt.Errorf("%s:%d: %d columns, want %d (%s)", name, line, len(rec), len(header), strings.Join(header, ","))
		}
		if err := row(&cells{name: name, header: header, rec: rec, line: line}); err != nil {
			return err
		}
	}
}
