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
	"math"
	"reflect"
	"strings"
	"testing"
)

// allocRows builds the allocator rows of one run the way allocatorResult.rows
// names them: every claim against plain, the ladders also against
// selective.
func allocRows(cases map[string]map[string]float64, order ...string) []Row {
	var rows []Row
	for _, cse := range order {
		m := cases[cse]
		for _, name := range []string{"selective", "ladder", "ladder, capacity floor"} {
			if v, ok := m[name]; ok {
				rows = append(rows, NewRow("allocator", cse, "mean per node", "µs", "plain", m["plain"], name, v, "note"))
			}
		}
		for _, name := range []string{"ladder", "ladder, capacity floor"} {
			if v, ok := m[name]; ok {
				rows = append(rows, NewRow("allocator", cse, "mean per node", "µs", "selective", m["selective"], name, v, ""))
			}
		}
	}
	return rows
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

func nearSpread(a, b Spread) bool {
	return near(a.Median, b.Median) && near(a.Min, b.Min) && near(a.Max, b.Max)
}

func TestMeansFromRows(t *testing.T) {
	rows := append(allocRows(map[string]map[string]float64{
		"500 nodes, A": {"plain": 20, "selective": 60, "ladder": 50, "ladder, capacity floor": 40},
		"500 nodes, B": {"plain": 30, "selective": 90, "ladder": 70},
	}, "500 nodes, B", "500 nodes, A"),
		NewRow("activation", "one evaluation", "median", "µs", "no attributes", 3, "all", 9, ""),
		NewRow("allocator", "500 nodes, A", "worst node", "µs", "plain", 999, "ladder", 999, ""),
	)
	got := MeansFromRows(rows)
	want := CaseMeans{
		Cases: []string{"500 nodes, B", "500 nodes, A"},
		Means: map[string]map[string]float64{
			"500 nodes, A": {"plain": 20, "selective": 60, "ladder": 50, "ladder, capacity floor": 40},
			"500 nodes, B": {"plain": 30, "selective": 90, "ladder": 70},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("MeansFromRows = %+v, want %+v", got, want)
	}
}

func TestMedianFloat(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{4}, 4},
		{[]float64{1, 2, 9}, 2},
		{[]float64{1, 2, 4, 9}, 3},
	} {
		if got := MedianFloat(tc.in); got != tc.want {
			t.Errorf("MedianFloat(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestPairOrder(t *testing.T) {
	var got []bool
	for p := range 4 {
		got = append(got, PairOrder(p)...)
	}
	// ABBA ABBA: each library runs first in half of the pairs.
	want := []bool{false, true, true, false, false, true, true, false}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("order = %v, want %v", got, want)
	}
}

func TestSchedOrder(t *testing.T) {
	for _, tc := range []struct {
		batch, schedulers int
		want              []int
	}{
		{0, 1, []int{0}},
		{1, 1, []int{0}},
		{0, 2, []int{0, 1}},
		{1, 2, []int{1, 0}},
		{2, 2, []int{0, 1}},
	} {
		if got := schedOrder(tc.batch, tc.schedulers); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("schedOrder(%d, %d) = %v, want %v", tc.batch, tc.schedulers, got, tc.want)
		}
	}
}

// libCase is the allocator case of libRun.
const libCase = "500 nodes, A"

// libRun is one run's rows of libCase.
func libRun(plain, ladder, capacity float64) []Row {
	return allocRows(map[string]map[string]float64{libCase: {"plain": plain, "selective": 100, "ladder": ladder, "ladder, capacity floor": capacity}}, libCase)
}

func TestCompareLibraries(t *testing.T) {
	for _, tc := range []struct {
		name           string
		stock, patched [][]Row
		want           []LibraryRatio
		wantPooled     Spread // of the plain ratios, over cases and pairs
	}{{
		name:    "one pair",
		stock:   [][]Row{libRun(20, 80, 60)},
		patched: [][]Row{libRun(14, 50, 45)},
		want: []LibraryRatio{{
			Case: libCase, Pairs: 1,
			StockPlain: Spread{20, 20, 20}, PatchedPlain: Spread{14, 14, 14},
			PlainRatio: Spread{0.7, 0.7, 0.7}, LadderRatio: Spread{2.25, 2.25, 2.25}, StockLadderRatio: Spread{3, 3, 3},
			CapacityBest: 1,
		}},
		wantPooled: Spread{0.7, 0.7, 0.7},
	}, {
		// The ratios are taken within each pair: a run that was slow for
		// both libraries (pair 2) gives the same ratio as the others, and
		// the median of the ratios is not the ratio of the medians.
		name:    "ratios within pairs",
		stock:   [][]Row{libRun(20, 40, 50), libRun(40, 80, 100), libRun(20, 40, 50)},
		patched: [][]Row{libRun(10, 30, 60), libRun(20, 60, 120), libRun(16, 30, 20)},
		want: []LibraryRatio{{
			Case: libCase, Pairs: 3,
			StockPlain: Spread{20, 20, 40}, PatchedPlain: Spread{16, 10, 20},
			PlainRatio: Spread{0.5, 0.5, 0.8}, LadderRatio: Spread{1.5, 1, 1.5}, StockLadderRatio: Spread{2, 2, 2},
			CapacityBest: 1,
		}},
		wantPooled: Spread{0.5, 0.5, 0.8},
	}, {
		name:    "even number of pairs: mean of the middle two",
		stock:   [][]Row{libRun(10, 30, 30), libRun(10, 30, 30)},
		patched: [][]Row{libRun(6, 20, 25), libRun(8, 28, 24)},
		want: []LibraryRatio{{
			Case: libCase, Pairs: 2,
			StockPlain: Spread{10, 10, 10}, PatchedPlain: Spread{7, 6, 8},
			PlainRatio: Spread{0.7, 0.6, 0.8}, LadderRatio: Spread{2.2, 2, 2.4}, StockLadderRatio: Spread{3, 3, 3},
			CapacityBest: 1,
		}},
		wantPooled: Spread{0.7, 0.6, 0.8},
	}, {
		// The plain claim is the same in every case: its ratios are
		// pooled over cases and pairs.
		name: "two cases pooled",
		stock: [][]Row{
			allocRows(map[string]map[string]float64{
				"A": {"plain": 20, "selective": 100, "ladder": 40, "ladder, capacity floor": 50},
				"B": {"plain": 10, "selective": 100, "ladder": 40, "ladder, capacity floor": 30}}, "A", "B"),
			allocRows(map[string]map[string]float64{
				"A": {"plain": 20, "selective": 100, "ladder": 40, "ladder, capacity floor": 50},
				"B": {"plain": 10, "selective": 100, "ladder": 40, "ladder, capacity floor": 30}}, "A", "B"),
		},
		patched: [][]Row{
			allocRows(map[string]map[string]float64{
				"A": {"plain": 12, "selective": 50, "ladder": 20, "ladder, capacity floor": 30},
				"B": {"plain": 9, "selective": 50, "ladder": 20, "ladder, capacity floor": 10}}, "A", "B"),
			allocRows(map[string]map[string]float64{
				"A": {"plain": 16, "selective": 50, "ladder": 20, "ladder, capacity floor": 30},
				"B": {"plain": 5, "selective": 50, "ladder": 20, "ladder, capacity floor": 10}}, "A", "B"),
		},
		want: []LibraryRatio{{
			Case: "A", Pairs: 2,
			StockPlain: Spread{20, 20, 20}, PatchedPlain: Spread{14, 12, 16},
			PlainRatio: Spread{0.7, 0.6, 0.8}, LadderRatio: Spread{1, 1, 1}, StockLadderRatio: Spread{2, 2, 2},
		}, {
			Case: "B", Pairs: 2,
			StockPlain: Spread{10, 10, 10}, PatchedPlain: Spread{7, 5, 9},
			PlainRatio: Spread{0.7, 0.5, 0.9}, LadderRatio: Spread{1, 1, 1}, StockLadderRatio: Spread{3, 3, 3},
			CapacityBest: 2,
		}},
		// 0.5, 0.6, 0.8, 0.9
		wantPooled: Spread{0.7, 0.5, 0.9},
	}, {
		name: "a case without both ladders is left out",
		stock: [][]Row{append(libRun(20, 40, 50), allocRows(map[string]map[string]float64{
			"500 nodes, attributes": {"plain": 20, "selective": 100, "ladder": 40}}, "500 nodes, attributes")...)},
		patched: [][]Row{append(libRun(10, 30, 60), allocRows(map[string]map[string]float64{
			"500 nodes, attributes": {"plain": 10, "selective": 50, "ladder": 20}}, "500 nodes, attributes")...)},
		want: []LibraryRatio{{
			Case: libCase, Pairs: 1,
			StockPlain: Spread{20, 20, 20}, PatchedPlain: Spread{10, 10, 10},
			PlainRatio: Spread{0.5, 0.5, 0.5}, LadderRatio: Spread{1.5, 1.5, 1.5}, StockLadderRatio: Spread{2, 2, 2},
		}},
		wantPooled: Spread{0.5, 0.5, 0.5},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := CompareLibraries(tc.stock, tc.patched)
			if err != nil {
				t.Fatal(err)
			}
			if !nearSpread(c.PlainPooled, tc.wantPooled) || c.PlainSamples != len(tc.want)*len(tc.stock) {
				t.Errorf("plain pooled = %+v over %d, want %+v over %d", c.PlainPooled, c.PlainSamples, tc.wantPooled, len(tc.want)*len(tc.stock))
			}
			got := c.Cases
			if len(got) != len(tc.want) {
				t.Fatalf("got %d cases %+v, want %d", len(got), got, len(tc.want))
			}
			for i, w := range tc.want {
				g := got[i]
				if g.Case != w.Case || g.Pairs != w.Pairs || g.CapacityBest != w.CapacityBest ||
					!nearSpread(g.StockPlain, w.StockPlain) || !nearSpread(g.PatchedPlain, w.PatchedPlain) ||
					!nearSpread(g.PlainRatio, w.PlainRatio) || !nearSpread(g.LadderRatio, w.LadderRatio) ||
					!nearSpread(g.StockLadderRatio, w.StockLadderRatio) {
					t.Errorf("case %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

// CompareLibraries refuses runs that cannot be paired case by case.
func TestCompareLibrariesRejects(t *testing.T) {
	for _, tc := range []struct {
		name           string
		stock, patched [][]Row
		wantErr        string
	}{
		{name: "unequal runs", stock: [][]Row{libRun(20, 40, 50), libRun(20, 40, 50)}, patched: [][]Row{libRun(10, 30, 60)}, wantErr: "as many stock as patched runs"},
		{name: "no runs", wantErr: "as many stock as patched runs"},
		{name: "a case missing from one patched run", stock: [][]Row{libRun(20, 40, 50), libRun(20, 40, 50)}, patched: [][]Row{libRun(10, 30, 60), nil}, wantErr: "no case has"},
		{name: "zero stock plain", stock: [][]Row{libRun(0, 40, 50)}, patched: [][]Row{libRun(10, 30, 60)}, wantErr: "stock plain mean is 0"},
	} {
		if _, err := CompareLibraries(tc.stock, tc.patched); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error = %v, want one containing %q", tc.name, err, tc.wantErr)
		}
	}
}

func TestMedianRows(t *testing.T) {
	row := func(cse string, a, b float64, note string) Row {
		return NewRow("allocator", cse, "mean per node", "µs", "plain", a, "ladder", b, note)
	}
	for _, tc := range []struct {
		name string
		runs [][]Row
		want []Row
	}{{
		name: "none",
	}, {
		name: "medians of A and B separately, notes of the first run",
		runs: [][]Row{
			{row("x", 10, 40, "first"), row("y", 1, 2, "")},
			{row("x", 30, 20, "second"), row("y", 3, 2, "")},
			{row("x", 20, 90, "third"), row("y", 2, 8, "")},
		},
		want: []Row{row("x", 20, 40, "first"), row("y", 2, 2, "")},
	}, {
		name: "a row missing from one run is dropped",
		runs: [][]Row{
			{row("x", 10, 40, ""), row("y", 1, 2, "")},
			{row("x", 30, 20, "")},
		},
		want: []Row{row("x", 20, 30, "")},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			got := MedianRows(tc.runs)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if g.Case != w.Case || g.Note != w.Note || !near(g.A, w.A) || !near(g.B, w.B) || !near(g.Ratio, w.Ratio) {
					t.Errorf("row %d = %+v, want %+v", i, g, w)
				}
			}
		})
	}
}

func TestIsPatched(t *testing.T) {
	for _, tc := range []struct {
		library string
		want    bool
	}{
		{"k8s.io/dynamic-resource-allocation v0.37.1", false},
		{"k8s.io/dynamic-resource-allocation v0.37.1 => /src/_output/upstream/k8s.io/dynamic-resource-allocation@v0.37.1", true},
		{"", false},
	} {
		if got := isPatched(tc.library); got != tc.want {
			t.Errorf("isPatched(%q) = %v, want %v", tc.library, got, tc.want)
		}
	}
}
