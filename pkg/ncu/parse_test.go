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

func TestParseFixtures(t *testing.T) {
	const (
		vectorAdd = "vectorAdd(const float *, const float *, float *, int)"
		fmaLoop   = "fmaLoop(float *, int)"
		tiny      = "tinyKernel(float *)"
	)
	tests := []struct {
		file    string
		layout  Layout
		version string
		dropped int
		kernels []string
		// metrics of the first launch, in base units.
		metrics map[string]float64
		absent  []string
		flops   float64 // of the first launch; 0 when not measured
		dram    float64 // bytes of the first launch; 0 when not measured
	}{{
		file:    "vectoradd_raw.csv",
		layout:  LayoutRaw,
		kernels: []string{vectorAdd},
		metrics: map[string]float64{
			MetricDuration: 1068512, MetricSMThroughput: 20.41, MetricMemoryThroughput: 90.12,
			MetricDRAMThroughput: 90.12, MetricL2Throughput: 35.24, MetricAchievedOccupancy: 82.31,
			MetricWavesPerSM: 992.97, MetricDRAMBytes: 3221430016,
		},
		flops: 268435456,
		dram:  3221430016,
	}, {
		file:    "vectoradd_details.csv",
		layout:  LayoutDetails,
		kernels: []string{vectorAdd},
		metrics: map[string]float64{
			MetricDuration: 1.07e6, MetricSMThroughput: 20.41, MetricMemoryThroughput: 90.12,
			MetricDRAMThroughput: 90.12, MetricL2Throughput: 35.24, MetricL1Throughput: 18.77,
			MetricAchievedOccupancy: 82.31, MetricTheoreticalOccupancy: 100, MetricWavesPerSM: 992.97,
			// "Memory Throughput" in Tbyte/second, from Memory Workload Analysis.
			MetricDRAMBytesPerSecond: 3.01e12, MetricSMCyclesPerSecond: 1.59e9,
		},
		absent: []string{MetricDRAMBytes},
		dram:   3.01e12 * 1.07e-3,
	}, {
		file:    "fmaloop_raw.csv",
		layout:  LayoutRaw,
		kernels: []string{fmaLoop},
		metrics: map[string]float64{
			MetricDuration: 196830, MetricSMThroughput: 91.3, MetricMemoryThroughput: 9.8,
			MetricDRAMBytes: 1212420, MetricWavesPerSM: 1,
		},
		flops: 2 * 4429185024,
		dram:  1212420,
	}, {
		file:    "fmaloop_details.csv",
		layout:  LayoutDetails,
		kernels: []string{fmaLoop},
		metrics: map[string]float64{
			MetricDuration: 196830, MetricSMThroughput: 91.3, MetricMemoryThroughput: 9.8,
			MetricDRAMThroughput: 0.61, MetricWavesPerSM: 1,
		},
		absent: []string{MetricDRAMBytes, MetricDRAMBytesPerSecond, MetricFFMA},
	}, {
		file:    "tinygrid_raw.csv",
		layout:  LayoutRaw,
		kernels: []string{tiny},
		metrics: map[string]float64{
			MetricDuration: 4256, MetricSMThroughput: 3.21, MetricMemoryThroughput: 1.87,
			MetricWavesPerSM: 0.01, MetricDRAMBytes: 16380, MetricSMCyclesPerSecond: 1.59e9,
			MetricFFMAPerCycle: 19.3691,
		},
		flops: (0 + 0.3026 + 2*19.3691) * 1.59e9 * 4256e-9,
		dram:  16380,
	}, {
		file:    "tinygrid_details.csv",
		layout:  LayoutDetails,
		kernels: []string{tiny},
		metrics: map[string]float64{
			MetricDuration: 4260, MetricSMThroughput: 3.21, MetricMemoryThroughput: 1.87,
			MetricWavesPerSM: 0.01, MetricAchievedOccupancy: 6.18,
		},
	}, {
		file:    "mixed_raw.csv",
		layout:  LayoutRaw,
		version: "2025.2.1.0",
		dropped: 1,
		kernels: []string{vectorAdd, fmaLoop, vectorAdd, tiny, tiny, tiny},
		metrics: map[string]float64{
			MetricDuration: 1e6, MetricSMThroughput: 20, MetricMemoryThroughput: 90,
			// Read from the pre-2023 name dram__throughput.
			MetricDRAMThroughput: 88,
		},
		absent: []string{"dram__throughput.avg.pct_of_peak_sustained_elapsed"},
	}}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			rep := parseFile(t, tc.file)
			if rep.Layout != tc.layout {
				t.Errorf("layout %q, want %q", rep.Layout, tc.layout)
			}
			if rep.Version != tc.version {
				t.Errorf("version %q, want %q", rep.Version, tc.version)
			}
			if rep.Dropped != tc.dropped {
				t.Errorf("dropped %d, want %d", rep.Dropped, tc.dropped)
			}
			var kernels []string
			for _, l := range rep.Launches {
				kernels = append(kernels, l.Kernel)
				if l.ComputeCapability != "9.0" && l.ComputeCapability != "8.0" {
					t.Errorf("launch %s: compute capability %q", l.ID, l.ComputeCapability)
				}
				if l.Device != "0" {
					t.Errorf("launch %s: device %q, want the index column \"0\"", l.ID, l.Device)
				}
			}
			if !reflect.DeepEqual(kernels, tc.kernels) {
				t.Fatalf("kernels %q, want %q", kernels, tc.kernels)
			}
			first := rep.Launches[0]
			for name, want := range tc.metrics {
				got, ok := first.Metric(name)
				if !ok || !near(got, want) {
					t.Errorf("%s = %v (measured %v), want %v", name, got, ok, want)
				}
			}
			for _, name := range tc.absent {
				if v, ok := first.Metric(name); ok {
					t.Errorf("%s = %v, want it absent", name, v)
				}
			}
			flops, ok := first.FLOPs()
			if ok != (tc.flops != 0) || !near(flops, tc.flops) {
				t.Errorf("FLOPs() = %v, %v; want %v", flops, ok, tc.flops)
			}
			dram, ok := first.DRAMBytes()
			if ok != (tc.dram != 0) || !near(dram, tc.dram) {
				t.Errorf("DRAMBytes() = %v, %v; want %v", dram, ok, tc.dram)
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
