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
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"k8s.io/klog/v2"
)

// allocatorModule is the library behind kube-scheduler's DRA plugin, the one
// hack/upstream-allocator.sh patches.
const allocatorModule = "k8s.io/dynamic-resource-allocation"

// AllocatorLibrary names the allocator library this binary was built with:
// its version, and where it was replaced from when it was (a build with
// -modfile=_output/upstream/go.mod). Empty when the build records no
// module information.
func AllocatorLibrary() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	for _, d := range info.Deps {
		if d.Path != allocatorModule {
			continue
		}
		if d.Replace != nil {
			return fmt.Sprintf("%s %s => %s", d.Path, d.Version, d.Replace.Path)
		}
		return d.Path + " " + d.Version
	}
	return ""
}

func isPatched(library string) bool { return strings.Contains(library, "=>") }

// LibraryOptions bound the interleaved comparison of the stock and the
// patched allocator library.
type LibraryOptions struct {
	StockBin, PatchedBin string // prism-bench binaries, built from the same commit
	Sizes                []int
	Passes               int    // --alloc-passes of every child run
	Pairs                int    // child runs of each library
	Dir                  string // where each child's JSON and output are kept
}

// LibraryRun is one child run: which library it had, the load when it
// started, and its JSON.
type LibraryRun struct {
	Pair    int     `json:"pair"`
	Patched bool    `json:"patched"`
	Library string  `json:"library"`
	Load1   float64 `json:"load1"`
	JSON    string  `json:"json"`
	rows    []Row
}

// InterleavedAllocator runs the allocator phase in child processes, Pairs
// times with each binary, alternating so that a change of load on the
// shared machine hits both libraries alike: the pairs go stock-patched,
// patched-stock, stock-patched, ... (ABBA), which also cancels a steady
// drift. Each child is an ordinary `prism-bench --only=allocator` run; its
// rows are the JSON that run writes. It returns the per-row medians of the
// stock runs (the allocator table) and, per profile, the ratios of each
// pair of neighbouring runs.
func InterleavedAllocator(ctx context.Context, o LibraryOptions) ([]Row, *LibraryComparison, []LibraryRun, error) {
	logger := klog.FromContext(ctx)
	if o.Pairs < 1 {
		return nil, nil, nil, fmt.Errorf("pairs must be at least 1, not %d", o.Pairs)
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, nil, nil, err
	}
	sizes := make([]string, len(o.Sizes))
	for i, n := range o.Sizes {
		sizes[i] = strconv.Itoa(n)
	}
	var runs []LibraryRun
	for p := range o.Pairs {
		for _, patched := range PairOrder(p) {
			bin, name := o.StockBin, "stock"
			if patched {
				bin, name = o.PatchedBin, "patched"
			}
			out := filepath.Join(o.Dir, fmt.Sprintf("pair%d-%s.json", p+1, name))
			log := filepath.Join(o.Dir, fmt.Sprintf("pair%d-%s.log", p+1, name))
			run := LibraryRun{Pair: p + 1, Patched: patched, Load1: Load1(), JSON: out}
			logger.Info("Allocator run", "pair", p+1, "library", name, "load1", run.Load1)
			if err := runChild(ctx, bin, log, "--only=allocator", "--alloc-sizes="+strings.Join(sizes, ","),
				fmt.Sprintf("--alloc-passes=%d", o.Passes), "--out="+out); err != nil {
				return nil, nil, runs, fmt.Errorf("pair %d, %s (%s): %w", p+1, name, bin, err)
			}
			rep, err := readReport(out)
			if err != nil {
				return nil, nil, runs, fmt.Errorf("pair %d, %s: %w", p+1, name, err)
			}
			run.Library, run.rows = rep.Host.AllocatorLibrary, rep.Rows
			// A binary built without the patch (or a stock one given as
			// patched) would make every ratio below meaningless.
			if isPatched(run.Library) != patched {
				return nil, nil, runs, fmt.Errorf("pair %d: the %s binary %s reports allocator library %q", p+1, name, bin, run.Library)
			}
			runs = append(runs, run)
		}
	}
	var stock, patched [][]Row
	for _, r := range runs {
		if r.Patched {
			patched = append(patched, r.rows)
		} else {
			stock = append(stock, r.rows)
		}
	}
	ratios, err := CompareLibraries(stock, patched)
	if err != nil {
		return nil, nil, runs, err
	}
	rows := MedianRows(stock)
	for i := range rows {
		rows[i].Note = strings.TrimPrefix(rows[i].Note+fmt.Sprintf("; median of %d stock runs interleaved with patched ones", len(stock)), "; ")
	}
	return rows, ratios, runs, nil
}

// PairOrder is the order of pair p (from 0): false is stock, true patched.
func PairOrder(p int) []bool {
	if p%2 == 0 {
		return []bool{false, true}
	}
	return []bool{true, false}
}

func runChild(ctx context.Context, bin, logPath string, args ...string) error {
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w (output in %s)", err, logPath)
	}
	return nil
}

func readReport(path string) (*Report, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(data, &rep); err != nil {
		return nil, fmt.Errorf("parsing %s: %w", path, err)
	}
	if len(rep.Errors) > 0 {
		return nil, fmt.Errorf("%s: %s", path, strings.Join(rep.Errors, "; "))
	}
	return &rep, nil
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

// CaseMeans are one run's allocator means: per case (fleet size and
// profile), µs per node of every claim shape, read back from its rows.
type CaseMeans struct {
	Cases []string // in the order of the rows
	Means map[string]map[string]float64
}

// MeansFromRows collects the "mean per node" of every claim named in the
// allocator rows (each row names two, A and B).
func MeansFromRows(rows []Row) CaseMeans {
	m := CaseMeans{Means: map[string]map[string]float64{}}
	for _, r := range rows {
		if r.Section != "allocator" || r.Metric != "mean per node" {
			continue
		}
		c, ok := m.Means[r.Case]
		if !ok {
			c = map[string]float64{}
			m.Means[r.Case] = c
			m.Cases = append(m.Cases, r.Case)
		}
		c[r.AName], c[r.BName] = r.A, r.B
	}
	return m
}

// Spread is a median over pairs and the range around it.
type Spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// spreadOf sorts v in place.
func spreadOf(v []float64) Spread {
	if len(v) == 0 {
		return Spread{}
	}
	slices.Sort(v)
	return Spread{Median: MedianFloat(v), Min: v[0], Max: v[len(v)-1]}
}

// MedianFloat of sorted values; the mean of the two middle ones when
// their number is even.
func MedianFloat(sorted []float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return sorted[n/2]
	default:
		return (sorted[n/2-1] + sorted[n/2]) / 2
	}
}

// The ladders the webhook writes; the better of the two is what a cluster
// would run (docs/upstream-allocator.md).
var ladderShapes = []string{"ladder", "ladder, capacity floor"}

// LibraryComparison compares the two libraries case by case, and on the
// plain claim over every case.
type LibraryComparison struct {
	Cases []LibraryRatio `json:"cases"`
	// PlainPooled: patched plain ÷ stock plain within each pair, over every
	// case and pair. The plain claim is the same in every case (it names no
	// profile), so each case measures it again, at another moment.
	PlainPooled  Spread `json:"plainPooled"`
	PlainSamples int    `json:"plainSamples"`
}

// LibraryRatio compares the two libraries on one case over the pairs.
// Ratios are taken within each pair, then summarised; the µs are medians of
// each library's runs.
type LibraryRatio struct {
	Case         string `json:"case"`
	Pairs        int    `json:"pairs"`
	StockPlain   Spread `json:"stockPlainUs"`
	PatchedPlain Spread `json:"patchedPlainUs"`
	// PlainRatio: patched plain ÷ stock plain.
	PlainRatio Spread `json:"plainRatio"`
	// LadderRatio: the cheaper patched ladder ÷ stock plain.
	LadderRatio Spread `json:"ladderRatio"`
	// StockLadderRatio: the cheaper stock ladder ÷ stock plain, for
	// reference.
	StockLadderRatio Spread `json:"stockLadderRatio"`
	// CapacityBest: pairs in which the patched ladder with the capacity
	// floor was the cheaper one.
	CapacityBest int `json:"capacityBest"`
}

// CompareLibraries pairs stock[i] with patched[i] (runs of the allocator
// phase, as rows) and compares, for every case that has a plain claim and
// both ladders in every run, the patched library with the stock one.
func CompareLibraries(stock, patched [][]Row) (*LibraryComparison, error) {
	if len(stock) != len(patched) || len(stock) == 0 {
		return nil, fmt.Errorf("need as many stock as patched runs, and some: %d and %d", len(stock), len(patched))
	}
	s := make([]CaseMeans, len(stock))
	p := make([]CaseMeans, len(patched))
	for i := range stock {
		s[i], p[i] = MeansFromRows(stock[i]), MeansFromRows(patched[i])
	}
	var out []LibraryRatio
	var pooled []float64
	for _, cse := range s[0].Cases {
		var sPlain, pPlain, plain, ladder, stockLadder []float64
		capacityBest := 0
		complete := true
		for i := range s {
			sm, pm := s[i].Means[cse], p[i].Means[cse]
			sp, ok1 := sm["plain"]
			pp, ok2 := pm["plain"]
			sl, ok3 := best(sm)
			pl, ok4 := best(pm)
			if !ok1 || !ok2 || !ok3 || !ok4 {
				complete = false
				break
			}
			if sp <= 0 {
				return nil, fmt.Errorf("%s, pair %d: stock plain mean is %v µs", cse, i+1, sp)
			}
			sPlain, pPlain = append(sPlain, sp), append(pPlain, pp)
			plain, ladder = append(plain, pp/sp), append(ladder, pl/sp)
			stockLadder = append(stockLadder, sl/sp)
			if pm[ladderShapes[1]] < pm[ladderShapes[0]] {
				capacityBest++
			}
		}
		if !complete {
			continue
		}
		pooled = append(pooled, plain...)
		out = append(out, LibraryRatio{
			Case: cse, Pairs: len(s),
			StockPlain: spreadOf(sPlain), PatchedPlain: spreadOf(pPlain),
			PlainRatio: spreadOf(plain), LadderRatio: spreadOf(ladder), StockLadderRatio: spreadOf(stockLadder),
			CapacityBest: capacityBest,
		})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no case has a plain claim and both ladders in every run")
	}
	return &LibraryComparison{Cases: out, PlainPooled: spreadOf(pooled), PlainSamples: len(pooled)}, nil
}

// best is the cheaper of the two ladders of one case.
func best(m map[string]float64) (float64, bool) {
	a, ok1 := m[ladderShapes[0]]
	b, ok2 := m[ladderShapes[1]]
	return min(a, b), ok1 && ok2
}

// rowKey identifies a row across runs.
type rowKey struct{ section, cse, metric, aName, bName string }

// MedianRows merges runs of the same phase into one: each row's A and B
// are their medians over the runs (and the ratio is recomputed); notes come
// from the first run. Rows missing from some run, or repeated within one,
// are dropped.
func MedianRows(runs [][]Row) []Row {
	if len(runs) == 0 {
		return nil
	}
	type vals struct{ a, b []float64 }
	all := map[rowKey]*vals{}
	for _, run := range runs {
		for _, r := range run {
			k := rowKey{r.Section, r.Case, r.Metric, r.AName, r.BName}
			v := all[k]
			if v == nil {
				v = &vals{}
				all[k] = v
			}
			v.a, v.b = append(v.a, r.A), append(v.b, r.B)
		}
	}
	var out []Row
	for _, r := range runs[0] {
		v := all[rowKey{r.Section, r.Case, r.Metric, r.AName, r.BName}]
		if len(v.a) != len(runs) {
			continue
		}
		slices.Sort(v.a)
		slices.Sort(v.b)
		out = append(out, NewRow(r.Section, r.Case, r.Metric, r.Unit, r.AName, MedianFloat(v.a), r.BName, MedianFloat(v.b), r.Note))
	}
	return out
}

// PrintLibraries writes the comparison as a table against the targets set
// for a patched scheduler (docs/upstream-allocator.md).
func PrintLibraries(w io.Writer, c *LibraryComparison) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CASE\tPAIRS\tSTOCK PLAIN µs\tPATCHED PLAIN µs\tPATCHED PLAIN ÷ STOCK PLAIN\tBEST PATCHED LADDER ÷ STOCK PLAIN\tBEST STOCK LADDER ÷ STOCK PLAIN\tCAPACITY FLOOR BEST")
	sp := func(s Spread, f string) string {
		return fmt.Sprintf(f+" ("+f+"–"+f+")", s.Median, s.Min, s.Max)
	}
	for _, r := range c.Cases {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d/%d\n", r.Case, r.Pairs,
			sp(r.StockPlain, "%.1f"), sp(r.PatchedPlain, "%.1f"),
			sp(r.PlainRatio, "%.2f"), sp(r.LadderRatio, "%.2f"), sp(r.StockLadderRatio, "%.2f"), r.CapacityBest, r.Pairs)
	}
	tw.Flush()
	fmt.Fprintf(w, "plain claim, the same in every case: patched plain ÷ stock plain over %d case-pairs: %s\n",
		c.PlainSamples, sp(c.PlainPooled, "%.3f"))
}
