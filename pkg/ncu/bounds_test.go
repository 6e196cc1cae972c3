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

package ncu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"
	"k8s.io/klog/v2"
)

// rows is a report written row by row as it is read, so that a test can
// scan tens of MiB without holding them.
type rows struct {
	header string
	row    func(i int) string
	n, i   int
	buf    []byte
	// every, when set, is called every 50,000 rows, from inside the scan.
	every func()
}

func (r *rows) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		switch {
		case r.header != "":
			r.buf, r.header = []byte(r.header+"\n"), ""
		case r.i < r.n:
			r.buf = []byte(r.row(r.i) + "\n")
			if r.i++; r.every != nil && r.i%50_000 == 0 {
				r.every()
			}
		default:
			return 0, io.EOF
		}
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// hostileReports are the shapes that made the parser's memory grow with the
// report: a launch per row with a name of its own, and metric names it
// does not use.
func hostileReports(n int) map[string]*rows {
	return map[string]*rows{
		"details, a launch and a kernel per row": {
			header: lead + `,"Metric Name","Metric Unit","Metric Value"`,
			n:      n,
			row: func(i int) string {
				return fmt.Sprintf(`"%d","k%d","0","9.0","Duration","nsecond","%d"`, i, i, i)
			},
		},
		"details, a new metric name per row": {
			header: lead + `,"Metric Name","Metric Unit","Metric Value"`,
			n:      n,
			row: func(i int) string {
				return fmt.Sprintf(`"0","k","0","9.0","x__%d","%%","1"`, i)
			},
		},
		"raw, a launch and a kernel per row": {
			header: lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"`,
			n:      n,
			row: func(i int) string {
				return fmt.Sprintf(`"%d","kernel-%d","0","9.0","%d","50","50"`, i, i, i+1)
			},
		},
	}
}

func liveHeap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestScanHoldsOneLaunch is the bound Scan promises: its live heap does
// not grow with the report. Each report is 500,000 rows (16-22 MiB);
// the parser that kept every launch held about 20 times that.
func TestScanHoldsOneLaunch(t *testing.T) {
	if testing.Short() {
		t.Skip("scans 60 MiB")
	}
	const n = 500_000
	const budget = 8 << 20
	for name, r := range hostileReports(n) {
		t.Run(name, func(t *testing.T) {
			base := liveHeap()
			var peak uint64
			sample := func() {
				if h := liveHeap(); h > base && h-base > peak {
					peak = h - base
				}
			}
			r.every = sample
			visits := 0
			_, err := Scan(context.Background(), r, func(*Launch) error {
				visits++
				return nil
			})
			// Some of these fail at the end (no complete launch); the
			// memory they held on the way is what counts.
			t.Logf("%d rows, %d launches passed on, err %v", r.i, visits, err)
			if r.i != n {
				t.Fatalf("scan stopped after %d of %d rows: %v", r.i, n, err)
			}
			sample()
			if peak > budget {
				t.Errorf("live heap grew by %d bytes scanning %d rows, more than the %d-byte budget", peak, n, budget)
			}
		})
	}
}

func TestScanRefusesUnboundedRecords(t *testing.T) {
	long := strings.Repeat("x", MaxLine)
	header := lead + `,"Metric Name","Metric Unit","Metric Value"` + "\n"
	tests := []struct {
		name  string
		input string
		want  string // substring of the error; "" for none
	}{{
		name:  "a CSV line longer than MaxLine",
		input: header + `"0","` + long + `","0","9.0","Duration","nsecond","1"` + "\n",
		want:  "longer than",
	}, {
		name:  "a quote left open swallows the rest",
		input: header + `"0","k` + "\n" + strings.Repeat(`"more`+"\n", 2*maxRecord/6),
		want:  "longer than",
	}, {
		name:  "a header of more than MaxColumns",
		input: `"a"` + strings.Repeat(`,"b"`, MaxColumns) + "\n",
		want:  "columns",
	}, {
		name:  "a row of more than MaxColumns",
		input: header + `"0"` + strings.Repeat(`,""`, MaxColumns) + "\n",
		want:  "fields",
	}, {
		name: "a long line that is not CSV is skipped",
		input: long + long + "\n" + header +
			`"0","k","0","9.0","Duration","nsecond","1"` + "\n" +
			`"0","k","0","9.0","Compute (SM) Throughput","%","1"` + "\n" +
			`"0","k","0","9.0","Memory Throughput","%","1"` + "\n",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Scan(context.Background(), strings.NewReader(tc.input), func(*Launch) error { return nil })
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Scan: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Scan error %v, want one that says %q", err, tc.want)
			}
			if err != nil && len(err.Error()) > 400 {
				t.Errorf("error of %d bytes quotes the report: %.100s...", len(err.Error()), err)
			}
		})
	}
}

func TestScanStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := hostileReports(1_000_000)["raw, a launch and a kernel per row"]
	visits := 0
	_, err := Scan(ctx, r, func(*Launch) error {
		if visits++; visits == 10 {
			cancel()
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Scan error %v, want context.Canceled", err)
	}
	if r.i > 10_000 {
		t.Errorf("Scan read %d rows after its context was cancelled at row 10", r.i)
	}
}

func TestScanStopsWithTheVisitor(t *testing.T) {
	stop := errors.New("enough")
	r := hostileReports(1000)["raw, a launch and a kernel per row"]
	_, err := Scan(context.Background(), r, func(*Launch) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("Scan error %v, want the visitor's", err)
	}
}

// TestScanLogsAFewLines: the report is the tenant's, and a line per
// dropped launch let 300 KB of report write 3.6 MB of log.
func TestScanLogsAFewLines(t *testing.T) {
	var lines []string
	logger := funcr.New(func(prefix, args string) { lines = append(lines, prefix+args) }, funcr.Options{Verbosity: 10})
	ctx := klog.NewContext(context.Background(), logger)
	name := strings.Repeat("k", 1000)
	var in bytes.Buffer
	in.WriteString(lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","lts__throughput.avg.pct_of_peak_sustained_elapsed"` + "\n")
	for i := range 2_000 {
		fmt.Fprintf(&in, `"%s-%d","%s","0","9.0","n/a","50","50","bad-%s"`+"\n", name, i, name, name)
	}
	fmt.Fprintf(&in, `"last","k","0","9.0","1","50","50","1"`+"\n")
	rep, err := Scan(ctx, &in, func(*Launch) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	if rep.Dropped != 2_000 {
		t.Errorf("dropped %d launches, want 2000", rep.Dropped)
	}
	if len(lines) > 2*maxLogged+1 {
		t.Errorf("%d log lines for one report, want at most %d", len(lines), 2*maxLogged+1)
	}
	for _, l := range lines {
		if len(l) > 600 {
			t.Errorf("log line of %d bytes: %.120s...", len(l), l)
		}
	}
}

// TestScanRefusesImpossibleValues: values no GPU measures would overflow
// the summary's sums into Inf and NaN.
func TestScanRefusesImpossibleValues(t *testing.T) {
	header := lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","dram__bytes.sum"` + "\n" +
		`"","","","","second","%","%","byte"` + "\n"
	tests := []struct {
		name, row string
		wantErr   bool
		wantDRAM  bool
	}{
		{name: "1e308 seconds", row: `"0","k","0","9.0","1e308","50","50","1"`, wantErr: true},
		{name: "two days", row: `"0","k","0","9.0","172800","50","50","1"`, wantErr: true},
		{name: "negative throughput", row: `"0","k","0","9.0","1","-5","50","1"`, wantErr: true},
		{name: "absurd optional metric is left out", row: `"0","k","0","9.0","1","50","50","1e300"`},
		{name: "a real launch", row: `"0","k","0","9.0","0.001","50","50","1e9"`, wantDRAM: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := parse(strings.NewReader(header + tc.row + "\n"))
			if (err != nil) != tc.wantErr {
				t.Fatalf("Scan error %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if _, ok := rep.Launches[0].DRAMBytes(); ok != tc.wantDRAM {
				t.Errorf("DRAM bytes kept %v, want %v", ok, tc.wantDRAM)
			}
		})
	}
}
