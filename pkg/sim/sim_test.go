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
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/prismgpu/prism/pkg/gpu"
	"github.com/prismgpu/prism/pkg/rewrite"
)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-40GB"
	l4   = "NVIDIA L4"
	l40s = "NVIDIA L40S"
)

func near(t *testing.T, what string, got, want float64) {
	t.Helper()
	if math.Abs(got-want) > 1e-3*math.Max(1, math.Abs(want)) {
		t.Errorf("%s = %.6g, want %.6g", what, got, want)
	}
}

func spec(t *testing.T, product string) gpu.Spec {
	t.Helper()
	s, ok := gpu.LookupSpec(product)
	if !ok {
		t.Fatalf("no spec for %s", product)
	}
	return s
}

func TestSpeed(t *testing.T) {
	// Reference A100-SXM4-40GB: 1555 GB/s, 19.5 TFLOPS. H100 SXM: 3350
	// GB/s, 67 TFLOPS. L4: 300 GB/s, 30.3 TFLOPS.
	for _, tc := range []struct {
		name    string
		job     Job
		product string
		want    float64
	}{
		{"reference is 1", Job{Bound: rewrite.MemoryBound}, a100, 1},
		{"memory-bound H100", Job{Bound: rewrite.MemoryBound}, h100, 3350.0 / 1555},           // 2.1543
		{"compute-bound H100", Job{Bound: rewrite.ComputeBound}, h100, 67 / 19.5},             // 3.4359
		{"latency-bound H100", Job{Bound: rewrite.LatencyBound}, h100, 1.131374},              // 3.4359^0.1
		{"balanced H100", Job{Bound: rewrite.Balanced}, h100, 2.720742},                       // sqrt(2.1543*3.4359)
		{"unknown is balanced", Job{Bound: rewrite.Unknown}, h100, 2.720742},                  //
		{"memory-bound L4", Job{Bound: rewrite.MemoryBound}, l4, 300.0 / 1555},                // 0.1929
		{"compute-bound L4", Job{Bound: rewrite.ComputeBound}, l4, 30.3 / 19.5},               // 1.5538
		{"sm 100 mem 0 is compute", Job{HasUtil: true, SMPct: 100}, h100, 67 / 19.5},          //
		{"sm 0 mem 100 is memory", Job{HasUtil: true, MemPct: 100}, h100, 3350.0 / 1555},      //
		{"both 100 is balanced", Job{HasUtil: true, SMPct: 100, MemPct: 100}, h100, 2.720742}, //
		{"both 0 is latency", Job{HasUtil: true}, h100, 1.131374},                             //
		{"util beats bound type", Job{Bound: rewrite.MemoryBound, HasUtil: true, SMPct: 100}, l4, 30.3 / 19.5},
		// sm 20, mem 80 on L4: u=0.8, ec=0.8*0.2+0.1*0.2=0.18, em=0.64;
		// 1.553846^0.18 * 0.192926^0.64 = 1.082622 * 0.348877 = 0.377702.
		{"blend", Job{HasUtil: true, SMPct: 20, MemPct: 80}, l4, 0.377702},
	} {
		t.Run(tc.name, func(t *testing.T) {
			near(t, "speed", Speed(&tc.job, spec(t, tc.product)), tc.want)
		})
	}
}

func cluster(t testing.TB, groups ...NodeGroup) *Cluster {
	t.Helper()
	cl, err := BuildCluster(context.Background(), &FleetConfig{NodeGroups: groups})
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func run(t *testing.T, cl *Cluster, jobs []*Job, mode Mode) *Result {
	t.Helper()
	for i, j := range jobs {
		j.ID = i
	}
	res, err := Simulate(context.Background(), cl, jobs, []Mode{mode}, Options{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	return res[0]
}

func TestEventLoopQueuesWhenFull(t *testing.T) {
	// One node with two reference GPUs. Job 0 takes both from 0 to 100;
	// job 1 arrives at 10, waits until 100 and runs 50 s.
	cl := cluster(t, NodeGroup{Name: "ref", Product: a100, GPUsPerNode: 2, Nodes: 1})
	for _, mode := range AllModes {
		r := run(t, cl, []*Job{
			{Arrival: 0, GPUs: 2, Runtime: 100, Bound: rewrite.MemoryBound},
			{Arrival: 10, GPUs: 1, Runtime: 50, Bound: rewrite.ComputeBound},
		}, mode)
		near(t, "mean JCT", r.MeanJCT, (100.0+140)/2)
		near(t, "p99 JCT", r.P99JCT, 140)
		near(t, "makespan", r.Makespan, 150)
		near(t, "utilisation", r.Utilisation, (2*100.0+50)/(2*150))
		near(t, "mean queue", r.MeanQueue, 90.0/2)
		if !reflect.DeepEqual(r.JCTs, []float64{100, 140}) {
			t.Errorf("%s: JCTs %v", mode, r.JCTs)
		}
	}
}

func TestEventLoopNoHeadOfLineBlocking(t *testing.T) {
	// Two reference GPUs. Job 0 holds one until 100; job 1 (2 GPUs)
	// waits for it; job 2 (1 GPU) arriving later starts at once on the
	// free GPU, as kube-scheduler would schedule it.
	cl := cluster(t, NodeGroup{Name: "ref", Product: a100, GPUsPerNode: 2, Nodes: 1})
	r := run(t, cl, []*Job{
		{Arrival: 0, GPUs: 1, Runtime: 100},
		{Arrival: 1, GPUs: 2, Runtime: 10},
		{Arrival: 2, GPUs: 1, Runtime: 10},
	}, Blind)
	// JCTs: job0 100, job2 10, job1 starts at 100 and ends at 110: 109.
	if want := []float64{10, 100, 109}; !reflect.DeepEqual(r.JCTs, want) {
		t.Errorf("JCTs %v, want %v", r.JCTs, want)
	}
	near(t, "mean queue", r.MeanQueue, 99.0/3)
}

func TestEventLoopPicksTierByProfile(t *testing.T) {
	// One H100 node and one L4 node with one GPU each; two memory-bound
	// jobs of 100 reference seconds arrive at 0 and 1. Performance puts
	// the first on the H100 (ultra tier): 100/(3350/1555) = 46.418 s; the
	// second on the L4 (fits): 100/(300/1555) = 518.333 s.
	cl := cluster(t,
		NodeGroup{Name: "l4", Product: l4, GPUsPerNode: 1, Nodes: 1},
		NodeGroup{Name: "h100", Product: h100, GPUsPerNode: 1, Nodes: 1})
	jobs := func() []*Job {
		return []*Job{
			{Arrival: 0, GPUs: 1, Runtime: 100, Bound: rewrite.MemoryBound},
			{Arrival: 1, GPUs: 1, Runtime: 100, Bound: rewrite.MemoryBound},
		}
	}
	r := run(t, cl, jobs(), Performance)
	near(t, "first JCT", r.JCTs[0], 46.41791)
	near(t, "second JCT", r.JCTs[1], 518.3333)
	if r.Requests["gpu/ultra"] != 1 || r.Requests["gpu/fits"] != 1 {
		t.Errorf("requests %v, want one ultra and one fits", r.Requests)
	}
	// Latency-bound economy prefers the L4 (low tier): 100/(30.3/19.5)^0.1.
	r = run(t, cl, []*Job{{Arrival: 0, GPUs: 1, Runtime: 100, Bound: rewrite.LatencyBound}}, Economy)
	near(t, "latency-bound on L4", r.JCTs[0], 100/math.Pow(30.3/19.5, 0.1))
	if r.Placements["latency -> "+l4] != 1 {
		t.Errorf("placements %v", r.Placements)
	}
}

func TestMultiGPUJobRunsAtSlowestGPU(t *testing.T) {
	// The mixed demo node has 2 H100, 2 A100 80GB PCIe, 2 L4, 2 T4. A
	// 7-GPU compute-bound job must include a T4 (8.1 TFLOPS).
	fc, err := LoadFleetConfig(writeTemp(t, "fleet.yaml", "nodeGroups:\n- name: mixed\n  fleetFile: "+abs(t, "../../demo/fleets/mixed.yaml")+"\n  nodes: 1\n"))
	if err != nil {
		t.Fatal(err)
	}
	cl, err := BuildCluster(context.Background(), fc)
	if err != nil {
		t.Fatal(err)
	}
	r := run(t, cl, []*Job{{Arrival: 0, GPUs: 7, Runtime: 100, Bound: rewrite.ComputeBound}}, Performance)
	near(t, "JCT", r.JCTs[0], 100/(8.1/19.5))
	r = run(t, cl, []*Job{{Arrival: 0, GPUs: 9, Runtime: 100}}, Blind)
	if r.Unplaceable != 1 || r.Jobs != 0 {
		t.Errorf("9-GPU job on an 8-GPU node: unplaceable %d, jobs %d", r.Unplaceable, r.Jobs)
	}
}

func abs(t *testing.T, p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func writeTemp(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseNative(t *testing.T) {
	jobs, err := ParseNative(strings.NewReader("arrival_s,gpus,runtime_s,bound_type,sm_pct,mem_pct\n# comment\n20,2,300,MemoryBound,,\n10,1,100,compute,80,20\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []*Job{
		{ID: 0, Arrival: 10, GPUs: 1, Runtime: 100, Bound: rewrite.ComputeBound, SMPct: 80, MemPct: 20, HasUtil: true},
		{ID: 1, Arrival: 20, GPUs: 2, Runtime: 300, Bound: rewrite.MemoryBound},
	}
	if !reflect.DeepEqual(jobs, want) {
		t.Errorf("got %+v %+v", *jobs[0], *jobs[1])
	}
	for _, bad := range []string{"1,0,10,memory\n", "1,1.5,10,memory\n", "1,1,10,fast\n", "x,1,10,memory\n", "1,1,10\n", "1,1,-5,memory\n"} {
		if _, err := ParseNative(strings.NewReader(bad)); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestParseAlibaba(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "alibaba_pods.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mix, err := ParseBoundMix("memory=1")
	if err != nil {
		t.Fatal(err)
	}
	jobs, st, err := ParseAlibaba(f, mix, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := (AlibabaStats{Rows: 7, Kept: 4, NoGPU: 1, NoTimes: 2, Fractional: 1}); st != want {
		t.Errorf("stats %+v, want %+v", st, want)
	}
	// Sorted by creation time, shifted to start at 0.
	type row struct {
		arrival, runtime float64
		gpus             int
	}
	var got []row
	for _, j := range jobs {
		got = append(got, row{j.Arrival, j.Runtime, j.GPUs})
		if j.Bound != rewrite.MemoryBound || j.HasUtil {
			t.Errorf("job %d: bound %s, util %v", j.ID, j.Bound, j.HasUtil)
		}
	}
	want := []row{{0, 900, 2}, {50, 3000, 1}, {150, 120, 1}, {400, 60, 8}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("jobs %v, want %v", got, want)
	}
}

func TestBoundMix(t *testing.T) {
	m, err := ParseBoundMix("memory=2,compute=1,latency=1")
	if err != nil {
		t.Fatal(err)
	}
	if m.String() != "memory=0.5,compute=0.25,latency=0.25" {
		t.Errorf("mix %s", m)
	}
	for _, bad := range []string{"memory", "memory=-1", "fast=1", "memory=0", "memory=1,memory=1"} {
		if _, err := ParseBoundMix(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestDeterminism(t *testing.T) {
	c := DefaultGenerateConfig()
	c.Jobs = 200
	a, b := Generate(c), Generate(c)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("Generate differs for the same seed")
	}
	c.Seed = 2
	if reflect.DeepEqual(a, Generate(c)) {
		t.Fatal("Generate ignores the seed")
	}
	var buf bytes.Buffer
	if err := WriteNative(&buf, a); err != nil {
		t.Fatal(err)
	}
	back, err := ParseNative(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a, back) {
		t.Fatal("WriteNative/ParseNative do not round-trip")
	}

	cl := cluster(t,
		NodeGroup{Name: "h100", Product: h100, GPUsPerNode: 8, Nodes: 2},
		NodeGroup{Name: "a100", Product: a100, GPUsPerNode: 8, Nodes: 2},
		NodeGroup{Name: "l4", Product: l4, GPUsPerNode: 8, Nodes: 2})
	sim := func(seed uint64) []*Result {
		r, err := Simulate(context.Background(), cl, a, AllModes, Options{Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r1, r2 := sim(7), sim(7); !reflect.DeepEqual(r1, r2) {
		t.Error("Simulate differs for the same seed")
	}

	f, err := os.Open(filepath.Join("testdata", "alibaba_pods.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	data := new(bytes.Buffer)
	if _, err := data.ReadFrom(f); err != nil {
		t.Fatal(err)
	}
	mix, _ := ParseBoundMix("memory=0.4,compute=0.4,latency=0.2")
	draw := func(seed uint64) []rewrite.BoundType {
		jobs, _, err := ParseAlibaba(bytes.NewReader(data.Bytes()), mix, seed)
		if err != nil {
			t.Fatal(err)
		}
		var out []rewrite.BoundType
		for _, j := range jobs {
			out = append(out, j.Bound)
		}
		return out
	}
	if !reflect.DeepEqual(draw(3), draw(3)) {
		t.Error("Alibaba bound types differ for the same seed")
	}
}

func TestDemoFleetAndTrace(t *testing.T) {
	fc, err := LoadFleetConfig("../../demo/sim/fleet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cl, err := BuildCluster(context.Background(), fc)
	if err != nil {
		t.Fatal(err)
	}
	if len(cl.Nodes) != 12 || cl.GPUs != 96 {
		t.Errorf("demo fleet: %d nodes, %d GPUs", len(cl.Nodes), cl.GPUs)
	}
	data, err := os.ReadFile("../../demo/sim/trace.csv")
	if err != nil {
		t.Fatal(err)
	}
	// The shipped trace is what `prismctl simulate generate` writes with
	// its defaults.
	var buf bytes.Buffer
	if err := WriteNative(&buf, Generate(DefaultGenerateConfig())); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, buf.Bytes()) {
		t.Error("demo/sim/trace.csv is not Generate(DefaultGenerateConfig()); regenerate it with: prismctl simulate generate -o demo/sim/trace.csv")
	}
}
