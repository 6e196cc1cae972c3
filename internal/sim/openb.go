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
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Machine is one node of the evaluation fleet.
type Machine struct {
	Name  string
	Model ModelID
	GPUs  int
	// CPU is in millicores, Memory in MiB, as the trace gives them.
	CPU, Memory int64
}

// NodeStats says what ParseNodes kept.
type NodeStats struct {
	Rows int
	// Skipped counts GPU nodes per trace model code that maps to no
	// measured model.
	Skipped map[string]int
}

// table reads a CSV with a header into rows addressed by column name.
type table struct {
	col  map[string]int
	rows [][]string
}

func readTable(r io.Reader, what string, need ...string) (*table, error) {
	cr := newCSVReader(r)
	header, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: reading header: %w", what, err)
	}
	t := &table{col: map[string]int{}}
	for i, h := range header {
		t.col[strings.TrimSpace(h)] = i
	}
	for _, n := range need {
		if _, ok := t.col[n]; !ok {
			return nil, fmt.Errorf("%s: header has no %s column", what, n)
		}
	}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		t.rows = append(t.rows, rec)
	}
}

func (t *table) str(rec []string, name string) string {
	i, ok := t.col[name]
	if !ok || i >= len(rec) {
		return ""
	}
	return strings.TrimSpace(rec[i])
}

// num reads a column; ok is false when it is empty.
func (t *table) num(rec []string, name string, line int) (v float64, ok bool, err error) {
	s := t.str(rec, name)
	if s == "" {
		return 0, false, nil
	}
	v, err = strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return 0, false, fmt.Errorf("row %d: %s %q is not a non-negative number", line, name, s)
	}
	return v, true, nil
}

// ParseNodes reads the trace's GPU node list (openb_node_list_gpu_node.csv:
// sn,cpu_milli,memory_mib,gpu,model) and keeps the nodes whose model maps
// to a measured one (traceModels).
func ParseNodes(r io.Reader) ([]Machine, NodeStats, error) {
	st := NodeStats{Skipped: map[string]int{}}
	t, err := readTable(r, "node list", "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, st, err
	}
	var out []Machine
	for i, rec := range t.rows {
		st.Rows++
		var v [3]float64
		for k, c := range []string{"cpu_milli", "memory_mib", "gpu"} {
			x, ok, err := t.num(rec, c, i+2)
			if err != nil {
				return nil, st, fmt.Errorf("node list: %w", err)
			}
			if !ok {
				return nil, st, fmt.Errorf("node list: row %d: %s is empty", i+2, c)
			}
			v[k] = x
		}
		if v[2] < 1 {
			continue
		}
		code := t.str(rec, "model")
		m, ok := traceModels[code]
		if !ok {
			st.Skipped[code] += int(v[2])
			continue
		}
		out = append(out, Machine{Name: t.str(rec, "sn"), Model: m, GPUs: int(v[2]), CPU: int64(v[0]), Memory: int64(v[1])})
	}
	if len(out) == 0 {
		return nil, st, fmt.Errorf("node list: no node with a measured GPU model")
	}
	return out, st, nil
}

// Pod is one GPU pod of the trace, cleaned.
type Pod struct {
	ID   int
	Name string
	// Arrival is seconds since the first kept pod's creation.
	Arrival float64
	GPUs    int
	// Milli is the share of each GPU in thousandths; 1000 is a whole GPU.
	// Only single-GPU pods share.
	Milli       int
	CPU, Memory int64
	// Allowed is the set of models the pod may run on (bit per ModelID);
	// Pinned says the trace's gpu_spec restricted it.
	Allowed uint8
	Pinned  bool
	// Runtime is the observed run time in seconds, on whatever GPU the pod
	// ran on; capped at PodOptions.Cap.
	Runtime float64
	Capped  bool
	// Censored pods were still running at the end of the trace: Runtime is
	// a lower bound. They hold resources but are left out of every metric.
	Censored bool
}

// PodOptions tune ParsePods.
type PodOptions struct {
	// Cap bounds runtimes, seconds; 0: no cap.
	Cap float64
	// WindowQuantile drops the pods created before this quantile of
	// creation times: the trace keeps a few pods created months before the
	// weeks most arrivals fall in, and compressing that gap would turn them
	// into a separate trickle.
	WindowQuantile float64
}

// podTimeColumns are what a replay needs of every pod: when it arrived,
// started and ended.
var podTimeColumns = []string{"creation_time", "deletion_time", "scheduled_time"}

// PodStats says what ParsePods kept and dropped, and why.
type PodStats struct {
	Rows, Kept, NoGPU, Failed, NeverScheduled, PinnedElsewhere, BeforeWindow, Censored, Capped, Shared, MultiGPU int
}

// ParsePods reads a pod list of cluster-trace-gpu-v2023 (openb_pod_list_*:
// name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,
// creation_time,deletion_time,scheduled_time). Pods without GPUs, Failed
// pods and pods never scheduled (Pending: no runtime) are dropped; pods
// whose deletion time is the trace's last timestamp are censored; a pod
// pinned only to models outside the fleet is dropped. The pod lists without
// time columns are rejected. See docs/simulator.md.
func ParsePods(r io.Reader, o PodOptions) ([]*Pod, PodStats, error) {
	var st PodStats
	t, err := readTable(r, "pod list", "name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, st, err
	}
	for _, c := range podTimeColumns {
		if _, ok := t.col[c]; !ok {
			// The trace's multigpu* lists are such lists. Arrival times cannot be
			// synthesised without deciding the very queueing the replay measures.
			return nil, st, fmt.Errorf("pod list: header has no %s column: replay needs %s, which the trace's multigpu* lists lack; use openb_pod_list_default.csv or a gpuspec*, gpushare* or cpu* list (docs/simulator.md)",
				c, strings.Join(podTimeColumns, ", "))
		}
	}
	end := 0.0
	for i, rec := range t.rows {
		v, _, err := t.num(rec, "deletion_time", i+2)
		if err != nil {
			return nil, st, fmt.Errorf("pod list: %w", err)
		}
		end = max(end, v)
	}
	var pods []*Pod
	for i, rec := range t.rows {
		st.Rows++
		line := i + 2
		var v [7]float64
		var have [7]bool
		for k, c := range []string{"cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time", "scheduled_time"} {
			if v[k], have[k], err = t.num(rec, c, line); err != nil {
				return nil, st, fmt.Errorf("pod list: %w", err)
			}
		}
		gpus := int(v[2])
		switch {
		case gpus < 1:
			st.NoGPU++
			continue
		case t.str(rec, "pod_phase") == "Failed":
			st.Failed++
			continue
		case !have[6] || !have[5] || !have[4]:
			st.NeverScheduled++
			continue
		}
		p := &Pod{Name: t.str(rec, "name"), Arrival: v[4], GPUs: gpus, Milli: 1000, CPU: int64(v[0]), Memory: int64(v[1]), Runtime: v[5] - v[6]}
		if gpus == 1 && have[3] && v[3] > 0 && v[3] < 1000 {
			p.Milli = int(v[3])
		}
		p.Allowed = 1<<numModels - 1
		if spec := t.str(rec, "gpu_spec"); spec != "" && spec != "nan" {
			p.Pinned, p.Allowed = true, 0
			for code := range strings.SplitSeq(spec, "|") {
				if m, ok := traceModels[code]; ok {
					p.Allowed |= 1 << m
				}
			}
			if p.Allowed == 0 {
				st.PinnedElsewhere++
				continue
			}
		}
		p.Censored = v[5] >= end
		pods = append(pods, p)
	}
	if len(pods) == 0 {
		return nil, st, fmt.Errorf("pod list: no pod left to simulate")
	}
	slices.SortStableFunc(pods, func(a, b *Pod) int {
		switch {
		case a.Arrival < b.Arrival:
			return -1
		case a.Arrival > b.Arrival:
			return 1
		}
		return 0
	})
	start := pods[int(o.WindowQuantile*float64(len(pods)-1))].Arrival
	kept := pods[:0]
	for _, p := range pods {
		if p.Arrival < start {
			st.BeforeWindow++
			continue
		}
		p.Arrival -= start
		p.ID = len(kept)
		if o.Cap > 0 && p.Runtime > o.Cap {
			p.Runtime, p.Capped = o.Cap, true
			st.Capped++
		}
		if p.Censored {
			st.Censored++
		}
		if p.Milli < 1000 {
			st.Shared++
		}
		if p.GPUs > 1 {
			st.MultiGPU++
		}
		kept = append(kept, p)
	}
	st.Kept = len(kept)
	return kept, st, nil
}

// WithoutModel removes a model from the fleet and from every pod's allowed
// set, dropping the pods pinned to it alone, for a sensitivity run on the
// measured models only. It returns how many pods it dropped.
func WithoutModel(machines []Machine, pods []*Pod, m ModelID) ([]Machine, []*Pod, int) {
	var ms []Machine
	for _, x := range machines {
		if x.Model != m {
			ms = append(ms, x)
		}
	}
	var ps []*Pod
	for _, p := range pods {
		c := *p
		c.Allowed &^= 1 << m
		if c.Allowed != 0 {
			ps = append(ps, &c)
		}
	}
	return ms, ps, len(pods) - len(ps)
}
