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
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// parsed is a report with copies of the launches Scan passed on.
type parsed struct {
	*Report
	Launches []Launch
}

func parse(r io.Reader) (*parsed, error) {
	var launches []Launch
	rep, err := Scan(context.Background(), r, func(l *Launch) error {
		c := *l
		c.Metrics = maps.Clone(l.Metrics)
		launches = append(launches, c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if rep.Launches != len(launches) {
		return nil, fmt.Errorf("report counts %d launches, %d were passed on", rep.Launches, len(launches))
	}
	return &parsed{Report: rep, Launches: launches}, nil
}

func parseFile(t *testing.T, name string) *parsed {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rep, err := parse(f)
	if err != nil {
		t.Fatalf("Scan(%s): %v", name, err)
	}
	return rep
}

func near(got, want float64) bool {
	return math.Abs(got-want) <= 1e-6*math.Max(1, math.Abs(want))
}

// fixtureLaunch is what a fixture test checks of each launch besides its
// metrics.
type fixtureLaunch struct {
	ID, Kernel, Device, ComputeCapability string
}

// fixtureWant is what Scan makes of a fixture: the report, every launch it
// passed on, and the first launch's metrics (all of them, in base units)
// with the FLOPs and DRAM bytes derived from them (nil when not measured).
type fixtureWant struct {
	Layout           Layout
	Version          string
	Dropped          int
	Launches         []fixtureLaunch
	Metrics          map[string]float64
	FLOPs, DRAMBytes *float64
}

// TestParseFixtures reads each file in testdata and checks it against the
// figures a person reads in the file (see testdata/README.md). The real
// captures come from ncu 2025.3.1.0 on an H100; the hand-written variants
// carry the forms real captures of that version lack.
func TestParseFixtures(t *testing.T) {
	const (
		h100      = "NVIDIA H100 80GB HBM3"
		vectorAdd = "vectorAdd(const float *, const float *, float *, int)"
		fmaLoop   = "fmaLoop(const float *, float *)"
		tiny      = "tinyKernel(const float *, float *)"
		// The hand-written variants' kernels take other arguments.
		oldFMALoop = "fmaLoop(float *, int)"
		oldTiny    = "tinyKernel(float *)"
	)
	f := func(v float64) *float64 { return &v }
	// The raw page carries the product name, the details page only the
	// device's index.
	raw := func(id, kernel string) fixtureLaunch { return fixtureLaunch{id, kernel, h100, "9.0"} }
	details := func(kernel string) fixtureLaunch { return fixtureLaunch{"0", kernel, "0", "9.0"} }
	tests := []struct {
		file string
		want fixtureWant
	}{{
		file: "vectoradd_raw.csv",
		want: fixtureWant{
			Layout:   LayoutRaw,
			Launches: []fixtureLaunch{raw("0", vectorAdd)},
			Metrics: map[string]float64{
				MetricDuration: 288352, MetricSMThroughput: 33.55, MetricMemoryThroughput: 82.28,
				MetricDRAMThroughput: 82.28, MetricL2Throughput: 79.90, MetricAchievedOccupancy: 76.46,
				MetricTheoreticalOccupancy: 100, MetricWavesPerSM: 248.24, MetricDRAMBytes: 795293440,
				MetricFAdd: 67108864, MetricFMul: 0, MetricFFMA: 0,
			},
			// One FADD per element of 2^26.
			FLOPs:     f(67108864),
			DRAMBytes: f(795293440),
		},
	}, {
		file: "vectoradd_details.csv",
		want: fixtureWant{
			Layout:   LayoutDetails,
			Launches: []fixtureLaunch{details(vectorAdd)},
			Metrics: map[string]float64{
				// "ns" and "hz", the short units of 2025.3.
				MetricDuration: 289184, MetricSMCyclesPerSecond: 1972575419.11,
				MetricSMThroughput: 33.44, MetricMemoryThroughput: 82.04, MetricDRAMThroughput: 82.04,
				MetricL1Throughput: 14.99, MetricL2Throughput: 79.61, MetricWavesPerSM: 248.24,
				MetricTheoreticalOccupancy: 100, MetricAchievedOccupancy: 76.48,
			},
			// The default sections count neither FP32 instructions nor
			// DRAM bytes.
		},
	}, {
		file: "fmaloop_raw.csv",
		want: fixtureWant{
			Layout:   LayoutRaw,
			Launches: []fixtureLaunch{raw("0", fmaLoop)},
			Metrics: map[string]float64{
				MetricDuration: 140832, MetricSMThroughput: 97.37, MetricMemoryThroughput: 0.40,
				MetricDRAMThroughput: 0.23, MetricL2Throughput: 0.84, MetricAchievedOccupancy: 60.71,
				MetricTheoreticalOccupancy: 100, MetricWavesPerSM: 1, MetricDRAMBytes: 1086464,
				MetricFAdd: 4325376, MetricFMul: 0, MetricFFMA: 4429185024,
			},
			FLOPs:     f(4325376 + 2*4429185024),
			DRAMBytes: f(1086464),
		},
	}, {
		file: "fmaloop_details.csv",
		want: fixtureWant{
			Layout:   LayoutDetails,
			Launches: []fixtureLaunch{details(fmaLoop)},
			Metrics: map[string]float64{
				MetricDuration: 140704, MetricSMCyclesPerSecond: 1976664664.83,
				MetricSMThroughput: 97.39, MetricMemoryThroughput: 0.37, MetricDRAMThroughput: 0.29,
				MetricL1Throughput: 0.11, MetricL2Throughput: 0.90, MetricWavesPerSM: 1,
				MetricTheoreticalOccupancy: 100, MetricAchievedOccupancy: 60.71,
			},
		},
	}, {
		file: "tinygrid_raw.csv",
		want: fixtureWant{
			Layout:   LayoutRaw,
			Launches: []fixtureLaunch{raw("0", tiny)},
			Metrics: map[string]float64{
				MetricDuration: 2784, MetricSMThroughput: 0.18, MetricMemoryThroughput: 11.53,
				MetricDRAMThroughput: 0.13, MetricL2Throughput: 13.02, MetricAchievedOccupancy: 3.12,
				MetricTheoreticalOccupancy: 100, MetricWavesPerSM: 0.01, MetricDRAMBytes: 12032,
				MetricFAdd: 0, MetricFMul: 0, MetricFFMA: 131072,
			},
			FLOPs:     f(2 * 131072),
			DRAMBytes: f(12032),
		},
	}, {
		file: "tinygrid_details.csv",
		want: fixtureWant{
			Layout:   LayoutDetails,
			Launches: []fixtureLaunch{details(tiny)},
			Metrics: map[string]float64{
				MetricDuration: 2784, MetricSMCyclesPerSecond: 1953125000,
				MetricSMThroughput: 0.18, MetricMemoryThroughput: 11.70, MetricDRAMThroughput: 0.13,
				MetricL1Throughput: 2.35, MetricL2Throughput: 13.01, MetricWavesPerSM: 0.01,
				MetricTheoreticalOccupancy: 100, MetricAchievedOccupancy: 3.12,
			},
		},
	}, {
		file: "mixed_raw.csv",
		want: fixtureWant{
			Layout: LayoutRaw,
			Launches: []fixtureLaunch{
				raw("0", vectorAdd), raw("1", vectorAdd), raw("2", fmaLoop),
				raw("3", tiny), raw("4", tiny), raw("5", tiny), raw("6", tiny),
			},
			Metrics: map[string]float64{
				MetricDuration: 289280, MetricSMThroughput: 33.36, MetricMemoryThroughput: 82.00,
				MetricDRAMThroughput: 82.00, MetricL2Throughput: 79.63, MetricAchievedOccupancy: 76.43,
				MetricTheoreticalOccupancy: 100, MetricWavesPerSM: 248.24, MetricDRAMBytes: 795256576,
				MetricFAdd: 67108864, MetricFMul: 0, MetricFFMA: 0,
			},
			FLOPs:     f(67108864),
			DRAMBytes: f(795256576),
		},
	}, {
		// `ncu --version` above the report, the pre-2023 name
		// dram__throughput, and an "n/a" duration (launch 6, dropped).
		file: "legacy-metric-names_raw.csv",
		want: fixtureWant{
			Layout:  LayoutRaw,
			Version: "2025.2.1.0",
			Dropped: 1,
			Launches: []fixtureLaunch{
				{"0", vectorAdd, "0", "8.0"}, {"1", oldFMALoop, "0", "8.0"}, {"2", vectorAdd, "0", "8.0"},
				{"3", oldTiny, "0", "8.0"}, {"4", oldTiny, "0", "8.0"}, {"5", oldTiny, "0", "8.0"},
			},
			Metrics: map[string]float64{
				MetricDuration: 1e6, MetricSMThroughput: 20, MetricMemoryThroughput: 90,
				// Read from dram__throughput, under its current name.
				MetricDRAMThroughput: 88, MetricAchievedOccupancy: 80, MetricWavesPerSM: 229.10,
			},
		},
	}, {
		// 196.83 usecond and 1,212.42 Kbyte.
		file: "scaled-units_raw.csv",
		want: fixtureWant{
			Layout:   LayoutRaw,
			Launches: []fixtureLaunch{{"0", oldFMALoop, "0", "9.0"}},
			Metrics: map[string]float64{
				MetricDuration: 196830, MetricSMThroughput: 91.3, MetricMemoryThroughput: 9.8,
				MetricDRAMThroughput: 0.61, MetricL2Throughput: 2.12, MetricAchievedOccupancy: 97.84,
				MetricWavesPerSM: 1, MetricDRAMBytes: 1212420,
				MetricFAdd: 0, MetricFMul: 0, MetricFFMA: 4429185024,
			},
			FLOPs:     f(2 * 4429185024),
			DRAMBytes: f(1212420),
		},
	}, {
		// FP32 work per elapsed cycle, with the clock in cycle/nsecond.
		file: "per-cycle-fp32_raw.csv",
		want: fixtureWant{
			Layout:   LayoutRaw,
			Launches: []fixtureLaunch{{"0", oldTiny, "0", "9.0"}},
			Metrics: map[string]float64{
				MetricDuration: 4256, MetricSMThroughput: 3.21, MetricMemoryThroughput: 1.87,
				MetricDRAMThroughput: 0.42, MetricL2Throughput: 1.10, MetricAchievedOccupancy: 6.18,
				MetricWavesPerSM: 0.01, MetricDRAMBytes: 16380, MetricSMCyclesPerSecond: 1.59e9,
				MetricFAddPerCycle: 0, MetricFMulPerCycle: 0.3026, MetricFFMAPerCycle: 19.3691,
			},
			FLOPs:     f((0 + 0.3026 + 2*19.3691) * 1.59e9 * 4256e-9),
			DRAMBytes: f(16380),
		},
	}, {
		// The Memory Workload Analysis section's "Memory Throughput" is a
		// byte rate, 3.01 Tbyte/second; the duration is 1.07 msecond.
		file: "dram-rate_details.csv",
		want: fixtureWant{
			Layout:   LayoutDetails,
			Launches: []fixtureLaunch{details(vectorAdd)},
			Metrics: map[string]float64{
				MetricDuration: 1.07e6, MetricSMCyclesPerSecond: 1.59e9,
				MetricSMThroughput: 20.41, MetricMemoryThroughput: 90.12, MetricDRAMThroughput: 90.12,
				MetricL1Throughput: 18.77, MetricL2Throughput: 35.24, MetricWavesPerSM: 992.97,
				MetricTheoreticalOccupancy: 100, MetricAchievedOccupancy: 82.31,
				MetricDRAMBytesPerSecond: 3.01e12,
			},
			DRAMBytes: f(3.01e12 * 1.07e-3),
		},
	}}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			rep := parseFile(t, tc.file)
			got := fixtureWant{Layout: rep.Layout, Version: rep.Version, Dropped: rep.Dropped}
			for _, l := range rep.Launches {
				got.Launches = append(got.Launches, fixtureLaunch{l.ID, l.Kernel, l.Device, l.ComputeCapability})
			}
			if len(rep.Launches) > 0 {
				first := rep.Launches[0]
				got.Metrics = first.Metrics
				if v, ok := first.FLOPs(); ok {
					got.FLOPs = &v
				}
				if v, ok := first.DRAMBytes(); ok {
					got.DRAMBytes = &v
				}
			}
			if diff := cmp.Diff(tc.want, got, cmpopts.EquateApprox(1e-9, 0)); diff != "" {
				t.Errorf("Scan(%s) (-want +got):\n%s", tc.file, diff)
			}
		})
	}
}

const lead = `"ID","Kernel Name","Device","CC"`

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name  string
		input string
		// want are substrings the error must contain.
		want    []string
		missing []string
	}{{
		name:  "empty",
		input: "",
		want:  []string{"no CSV table"},
	}, {
		name:  "noise only",
		input: "==PROF== Connected to process 1\n==ERROR== ERR_NVGPUCTRPERM - no permission\n",
		want:  []string{"no CSV table"},
	}, {
		name:  "unknown header",
		input: "\"a\",\"b\"\n\"1\",\"2\"\n",
		want:  []string{"unrecognised ncu CSV header"},
	}, {
		name: "raw without duration and SM throughput",
		input: lead + `,"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","lts__throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","%","%"
"0","k","0","9.0","50","40"
`,
		want:    []string{MetricSMThroughput, `"Compute (SM) Throughput"`, MetricDuration, `"Duration"`},
		missing: []string{MetricSMThroughput, MetricDuration},
	}, {
		name: "details without memory throughput",
		input: lead + `,"Section Name","Metric Name","Metric Unit","Metric Value"
"0","k","0","9.0","GPU Speed Of Light Throughput","Duration","usecond","2.5"
"0","k","0","9.0","GPU Speed Of Light Throughput","Compute (SM) Throughput","%","50"
"0","k","0","9.0","Memory Workload Analysis","Memory Throughput","Gbyte/second","900"
`,
		want:    []string{MetricMemoryThroughput},
		missing: []string{MetricMemoryThroughput},
	}, {
		name: "required metric not a number",
		input: lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","nsecond","%","%"
"7","k","0","9.0","1000","fast","20"
`,
		want: []string{`launch "7"`, MetricSMThroughput, `"fast"`},
	}, {
		name: "decimal comma is not a thousands separator",
		input: lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","nsecond","%","%"
"0","k","0","9.0","1000","20,5","20"
`,
		want: []string{`"20,5"`},
	}, {
		name: "duration in cycles",
		input: lead + `,"Metric Name","Metric Unit","Metric Value"
"0","k","0","9.0","Duration","cycle","1000"
`,
		want: []string{`unit "cycle" is not a time`},
	}, {
		name: "no launch has every required metric",
		input: lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","nsecond","%","%"
"0","k","0","9.0","n/a","20","20"
"2","k","0","9.0","1000","n/a","20"
`,
		want: []string{"none of the 2 launches"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parse(strings.NewReader(tc.input))
			if err == nil {
				t.Fatalf("Parse succeeded, want an error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			var mm *MissingMetricsError
			if errors.As(err, &mm) != (tc.missing != nil) {
				t.Fatalf("error %v: MissingMetricsError is %v, want %v", err, mm != nil, tc.missing != nil)
			}
			if mm != nil && !reflect.DeepEqual(mm.Metrics, tc.missing) {
				t.Errorf("missing %q, want %q", mm.Metrics, tc.missing)
			}
		})
	}
}

func TestParseVariants(t *testing.T) {
	tests := []struct {
		name     string
		input    string
		launches int
		version  string
		check    func(t *testing.T, r *parsed)
	}{{
		name: "details with metric names, no ID column, two launches of one kernel",
		input: `"Kernel Name","Metric Name","Metric Unit","Metric Value"
"k","gpu__time_duration.sum","usecond","2"
"k","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","10"
"k","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","%","70"
"k","gpu__time_duration.sum","usecond","3"
"k","sm__throughput.avg.pct_of_peak_sustained_elapsed","%","11"
"k","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed","%","71"
`,
		launches: 2,
		check: func(t *testing.T, r *parsed) {
			if d := r.Launches[1].Duration(); d.Nanoseconds() != 3000 {
				t.Errorf("second launch lasted %v, want 3us", d)
			}
		},
	}, {
		name: "raw page with device name metric, CRLF, BOM, no units row",
		input: "\ufeff" + lead + `,"device__attribute_display_name","gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"` + "\r\n" +
			`"0","k","0","8.6","NVIDIA A10","1,500","50","60"` + "\r\n",
		launches: 1,
		check: func(t *testing.T, r *parsed) {
			l := r.Launches[0]
			if l.Device != "NVIDIA A10" || l.ComputeCapability != "8.6" || l.Metrics[MetricDuration] != 1500 {
				t.Errorf("got %+v", l)
			}
		},
	}, {
		name: "launches with an n/a required metric are dropped",
		input: lead + `,"gpu__time_duration.sum","sm__throughput.avg.pct_of_peak_sustained_elapsed","gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"
"","","","","nsecond","%","%"
"0","k","0","9.0","n/a","20","20"
"1","k","0","9.0","1000","20","20"
"2","k","0","9.0","1000","n/a","20"
`,
		launches: 1,
		check: func(t *testing.T, r *parsed) {
			if r.Dropped != 2 || r.Launches[0].ID != "1" {
				t.Errorf("kept launch %q, dropped %d; want launch \"1\" and 2 dropped", r.Launches[0].ID, r.Dropped)
			}
		},
	}, {
		name:     "header only is an empty report",
		input:    lead + `,"Section Name","Metric Name","Metric Unit","Metric Value"` + "\n",
		launches: 0,
	}, {
		name: "version from a ==PROF== line, noise between rows",
		input: `==PROF== Nsight Compute version 2024.3.2.0
"Kernel Name","Metric Name","Metric Unit","Metric Value"
"k","Duration","nsecond","1,000"
application says hello
"k","Compute (SM) Throughput","%","10"
"k","Memory Throughput","%","n/a"
"k","Memory Throughput","%","12"
`,
		launches: 1,
		version:  "2024.3.2.0",
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := parse(strings.NewReader(tc.input))
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Launches) != tc.launches || rep.Version != tc.version {
				t.Fatalf("got %d launches, version %q; want %d, %q", len(rep.Launches), rep.Version, tc.launches, tc.version)
			}
			if tc.check != nil {
				tc.check(t, rep)
			}
		})
	}
}

func TestParseValue(t *testing.T) {
	tests := []struct {
		in      string
		want    float64
		wantErr bool
		unmeas  bool
	}{
		{in: "2,147,483,648", want: 2147483648},
		{in: "1,234.5", want: 1234.5},
		{in: " 87.5 ", want: 87.5},
		{in: "1e3", want: 1000},
		{in: "n/a", unmeas: true},
		{in: "N/A", unmeas: true},
		{in: "", unmeas: true},
		{in: "12,5", wantErr: true},
		{in: "1,23,456", wantErr: true},
		{in: "NaN", wantErr: true},
		{in: "Inf", wantErr: true},
		{in: "fast", wantErr: true},
	}
	for _, tc := range tests {
		got, err := parseValue(tc.in)
		switch {
		case tc.unmeas:
			if !errors.Is(err, errNotMeasured) {
				t.Errorf("parseValue(%q) = %v, %v; want not measured", tc.in, got, err)
			}
		case tc.wantErr:
			if err == nil || errors.Is(err, errNotMeasured) {
				t.Errorf("parseValue(%q) = %v, %v; want an error", tc.in, got, err)
			}
		case err != nil || got != tc.want:
			t.Errorf("parseValue(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func TestUnitScale(t *testing.T) {
	tests := map[string]float64{
		"":                1,
		"%":               1,
		"nsecond":         1,
		"usecond":         1e3,
		"us":              1e3,
		"msecond":         1e6,
		"second":          1e9,
		"byte":            1,
		"Kbyte":           1e3,
		"Mbyte":           1e6,
		"Gbyte":           1e9,
		"byte/second":     1,
		"Gbyte/second":    1e9,
		"Tbyte/second":    1e12,
		"Mbyte/usecond":   1e12,
		"cycle/nsecond":   1e9,
		"Ghz":             1e9,
		"inst/cycle":      1,
		"Kbyte/block":     1e3,
		"register/thread": 1,
		"unheard-of":      1,
	}
	for unit, want := range tests {
		if got := unitScale(unit); !near(got, want) {
			t.Errorf("unitScale(%q) = %v, want %v", unit, got, want)
		}
	}
}
