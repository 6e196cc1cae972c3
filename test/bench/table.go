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

package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Row compares A and B, both measured in this run. Ratio is B/A.
type Row struct {
	Section string  `json:"section"`
	Case    string  `json:"case"`
	Metric  string  `json:"metric"`
	Unit    string  `json:"unit"`
	AName   string  `json:"aName"`
	A       float64 `json:"a"`
	BName   string  `json:"bName"`
	B       float64 `json:"b"`
	Ratio   float64 `json:"ratio"`
	// Note holds context: sample counts, where the worst case was, the
	// reference figures it is compared with.
	Note string `json:"note,omitempty"`
}

// NewRow fills in the ratio.
func NewRow(section, cse, metric, unit, aName string, a float64, bName string, b float64, note string) Row {
	r := Row{Section: section, Case: cse, Metric: metric, Unit: unit, AName: aName, A: a, BName: bName, B: b, Note: note}
	if a != 0 {
		r.Ratio = b / a
	}
	return r
}

// Report is what bench.json holds.
type Report struct {
	Started  time.Time     `json:"started"`
	Duration string        `json:"duration"`
	Host     Host          `json:"host"`
	Rows     []Row         `json:"rows"`
	Errors   []string      `json:"errors,omitempty"`
	Phases   []PhaseTiming `json:"phases"`
}

// Host describes where the numbers were taken.
type Host struct {
	CPUs      int    `json:"cpus"`
	GoVersion string `json:"goVersion"`
	StateFS   string `json:"stateFS"`
	// Load1 is the one-minute load average when the run started and ended.
	Load1Start float64 `json:"load1Start"`
	Load1End   float64 `json:"load1End"`
}

// Load1 is the one-minute load average, or -1 where /proc/loadavg cannot
// be read.
func Load1() float64 {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// PhaseTiming is how long each phase of the run took.
type PhaseTiming struct {
	Phase   string `json:"phase"`
	Seconds string `json:"seconds"`
}

func fmtNum(v float64) string {
	switch {
	case v == 0:
		return "0"
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

// Print writes the rows as one aligned table.
func Print(w io.Writer, rows []Row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SECTION\tCASE\tMETRIC\tA\tB\tB/A\tNOTE")
	for _, r := range rows {
		ratio := "-"
		if r.Ratio != 0 {
			ratio = fmt.Sprintf("%.2fx", r.Ratio)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s [%s]\t%s %s\t%s %s\t%s\t%s\n", r.Section, r.Case, r.Metric, r.Unit,
			r.AName, fmtNum(r.A), r.BName, fmtNum(r.B), ratio, r.Note)
	}
	tw.Flush()
}

// WriteTable writes the full table (Print) to path, creating the
// directory.
func WriteTable(path string, rep *Report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	var b strings.Builder
	Print(&b, rep.Rows)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// WriteJSON writes the report, creating the directory.
func WriteJSON(path string, rep *Report) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Percentile of sorted-in-place samples, nearest rank.
func Percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	slices.Sort(samples)
	i := int(math.Ceil(q*float64(len(samples)))) - 1
	return samples[min(max(i, 0), len(samples)-1)]
}

// Median of durations.
func Median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
