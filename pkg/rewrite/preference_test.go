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

package rewrite

import (
	"context"
	"maps"
	"reflect"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-40GB"
	l4   = "NVIDIA L4"
)

// e2eFleet is the e2e test bed's fleet: one node per model.
func e2eFleet(mixedA100 int) *Fleet {
	return &Fleet{Models: []Model{
		{Name: a100, Devices: 8, BandwidthGBps: 1555, FP32GFLOPS: 19500, MemoryBytes: 40 << 30, MixedDevices: mixedA100},
		{Name: h100, Devices: 8, BandwidthGBps: 3350, FP32GFLOPS: 67000, MemoryBytes: 81559 << 20},
		{Name: l4, Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300, MemoryBytes: 22 << 30},
	}}
}

func TestNodePreference(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	memPerf := Profile{Name: "stream", BoundType: prismv1alpha1.BoundTypeMemoryBound}
	for _, tc := range []struct {
		name    string
		profile Profile
		opts    []Option
		mode    PreferenceMode
		reason  string
		terms   []NodeTerm
		// subrequests the claim gets; nil: the claim stays as written.
		subrequests []string
	}{
		{"ladder mode keeps the ladder", memPerf, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferLadder)}, PreferLadder, "--preference=ladder", nil,
			[]string{"bandwidth-top", "bandwidth-second", "fits"}},
		{"no hard needs: the claim stays plain, the pod prefers H100 then A100", memPerf, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferAffinity)}, PreferAffinity, "single-model",
			[]NodeTerm{{100, "bandwidth-top", []string{h100}}, {50, "bandwidth-second", []string{a100}}}, nil},
		{"hard needs: the claim keeps fits alone; L4 cannot hold it", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: q("20Gi")}, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferAffinity)}, PreferAffinity, "single-model",
			[]NodeTerm{{100, "bandwidth-top", []string{h100}}}, []string{"fits"}},
		{"latency-bound economy prefers the smallest cards", Profile{BoundType: prismv1alpha1.BoundTypeLatencyBound, Policy: prismv1alpha1.PolicyEconomy}, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferAffinity)}, PreferAffinity, "single-model",
			[]NodeTerm{{100, "bandwidth-bottom", []string{l4}}}, nil},
		{"compute-bound economy with needs prefers the value class", Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: q("8Gi")}, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferAffinity)}, PreferAffinity, "single-model",
			[]NodeTerm{{100, "fp32-value", []string{l4}}}, []string{"fits"}},
		{"a fitting model on a mixed node keeps the ladder", memPerf, []Option{WithFleet(e2eFleet(4)), WithPreference(PreferAffinity)}, PreferLadder, "4 of 8 " + a100 + " devices sit on nodes with other models", nil,
			[]string{"bandwidth-top", "bandwidth-second", "fits"}},
		{"a mixed model that cannot hold the workload does not matter", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: q("40Gi")}, []Option{WithFleet(e2eFleet(4)), WithPreference(PreferAffinity)}, PreferLadder, "no preferred tier", nil,
			[]string{"fits"}},
		{"load-aware keeps the ladder", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, Policy: prismv1alpha1.PolicyLoadAware}, []Option{WithFleet(e2eFleet(0)), WithLoad(&Load{}), WithPreference(PreferAffinity)}, PreferLadder, "live load", nil,
			[]string{"bandwidth-top", "bandwidth-second", "fits"}},
		{"no fleet known keeps the built-in ladder", memPerf, []Option{WithPreference(PreferAffinity)}, PreferLadder, "no published fleet", nil,
			[]string{"ultra", "high", "fits"}},
		{"one model: nothing to prefer", memPerf, []Option{WithFleet(&Fleet{Models: []Model{{Name: l4, Devices: 4, BandwidthGBps: 300}}}), WithPreference(PreferAffinity)}, PreferLadder, "nothing to prefer", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NodePreference(tc.profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if d.Mode != tc.mode || !strings.Contains(d.Reason, tc.reason) {
				t.Errorf("decision %s (%s), want %s with %q", d.Mode, d.Reason, tc.mode, tc.reason)
			}
			if !reflect.DeepEqual(d.Terms, tc.terms) {
				t.Errorf("terms %+v, want %+v", d.Terms, tc.terms)
			}
			spec, plan, err := Rewrite(context.Background(), oneGPU(), tc.profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			// The claim webhook reaches the pod webhook's decision.
			if plan.Preference == nil || !reflect.DeepEqual(*plan.Preference, *d) {
				t.Errorf("plan's preference %+v differs from NodePreference's %+v", plan.Preference, d)
			}
			var subs []string
			for _, s := range spec.Devices.Requests[0].FirstAvailable {
				subs = append(subs, s.Name)
			}
			if !reflect.DeepEqual(subs, tc.subrequests) {
				t.Errorf("subrequests %v, want %v", subs, tc.subrequests)
			}
			if tc.subrequests == nil && !reflect.DeepEqual(spec, oneGPU()) {
				t.Errorf("claim changed: %+v", spec.Devices.Requests[0])
			}
		})
	}
}

// In affinity mode the decision names the models below the claim's memory
// floor: the claim cannot allocate on their nodes, so the pod webhook may
// keep the pod off them with a required term.
func TestExcludedNodes(t *testing.T) {
	q := func(s string) *resource.Quantity { v := resource.MustParse(s); return &v }
	needs20Gi := Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: q("20Gi")}
	affinity := WithPreference(PreferAffinity)
	for _, tc := range []struct {
		name    string
		profile Profile
		opts    []Option
		exclude []string
		// values of the NotIn requirement; nil: no requirement.
		values []string
	}{
		{"a memory floor above the L4's excludes the L4 nodes", needs20Gi, []Option{WithFleet(e2eFleet(0)), affinity}, []string{l4}, []string{"NVIDIA-L4"}},
		{"no memory need excludes nothing", Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound}, []Option{WithFleet(e2eFleet(0)), affinity}, nil, nil},
		{"a floor every model holds excludes nothing", Profile{BoundType: prismv1alpha1.BoundTypeComputeBound, Policy: prismv1alpha1.PolicyEconomy, PeakMemory: q("8Gi")}, []Option{WithFleet(e2eFleet(0)), affinity}, nil, nil},
		{"ladder mode writes no pod terms", needs20Gi, []Option{WithFleet(e2eFleet(0)), WithPreference(PreferLadder)}, nil, nil},
		{"a model of unknown memory is never excluded", needs20Gi, []Option{WithFleet(&Fleet{Models: []Model{
			{Name: h100, Devices: 8, BandwidthGBps: 3350, MemoryBytes: 81559 << 20},
			{Name: l4, Devices: 4, BandwidthGBps: 300},
		}}), affinity}, nil, nil},
		{"a label value shared with a model that fits is not excluded", needs20Gi, []Option{WithFleet(&Fleet{Models: []Model{
			{Name: h100, Devices: 8, BandwidthGBps: 3350, MemoryBytes: 81559 << 20},
			{Name: "NVIDIA L4", Devices: 4, BandwidthGBps: 300, MemoryBytes: 22 << 30},
			{Name: "NVIDIA-L4", Devices: 4, BandwidthGBps: 900, MemoryBytes: 48 << 30},
			{Name: a100, Devices: 8, BandwidthGBps: 1555, MemoryBytes: 20 << 30},
		}}), affinity}, []string{a100}, []string{"NVIDIA-A100-SXM4-40GB"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := NodePreference(tc.profile, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(d.Exclude, tc.exclude) {
				t.Errorf("exclude %v, want %v (decision %s: %s)", d.Exclude, tc.exclude, d.Mode, d.Reason)
			}
			req := d.ExcludedNodes()
			switch {
			case tc.values == nil && req != nil:
				t.Errorf("requirement %+v, want none", req)
			case tc.values != nil && (req == nil || req.Key != ModelLabel || req.Operator != corev1.NodeSelectorOpNotIn || !reflect.DeepEqual(req.Values, tc.values)):
				t.Errorf("requirement %+v, want %s NotIn %v", req, ModelLabel, tc.values)
			}
		})
	}
}

// Without WithPreference the plan says nothing about a mode, as before.
func TestNoPreferenceOptionLeavesThePlanAsBefore(t *testing.T) {
	_, plan, err := Rewrite(context.Background(), oneGPU(), Profile{BoundType: prismv1alpha1.BoundTypeMemoryBound}, WithFleet(e2eFleet(0)))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Preference != nil {
		t.Errorf("plan has a preference %+v without WithPreference", plan.Preference)
	}
}

func TestModelLabelValue(t *testing.T) {
	for in, want := range map[string]string{
		h100:                       "NVIDIA-H100-80GB-HBM3",
		a100:                       "NVIDIA-A100-SXM4-40GB",
		"NVIDIA GeForce RTX 4090":  "NVIDIA-GeForce-RTX-4090",
		"  odd (name) / x ":        "odd-name-x",
		"Tesla T4":                 "Tesla-T4",
		strings.Repeat("A", 70):    strings.Repeat("A", 63),
		"ünïcode GPU":              "n-code-GPU",
		strings.Repeat("a ", 40):   strings.TrimSuffix(strings.Repeat("a-", 32), "-"),
		"":                         "",
		"NVIDIA A100 80GB PCIe...": "NVIDIA-A100-80GB-PCIe",
	} {
		if got := ModelLabelValue(in); got != want {
			t.Errorf("ModelLabelValue(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestNodeLabels(t *testing.T) {
	f := e2eFleet(0)
	for _, tc := range []struct {
		name   string
		models []string
		fleet  *Fleet
		want   map[string]string
	}{
		{"H100 node", []string{h100, h100}, f, map[string]string{ModelLabel: "NVIDIA-H100-80GB-HBM3", BandwidthClassLabel: "1", FP32ClassLabel: "1"}},
		{"A100 node: slowest in FP32", []string{a100}, f, map[string]string{ModelLabel: "NVIDIA-A100-SXM4-40GB", BandwidthClassLabel: "2", FP32ClassLabel: "3"}},
		{"L4 node: bandwidth class 3, fp32 between the others", []string{l4}, f, map[string]string{ModelLabel: "NVIDIA-L4", BandwidthClassLabel: "3", FP32ClassLabel: "2"}},
		{"mixed node gets nothing", []string{h100, l4}, f, nil},
		{"no GPUs", nil, f, nil},
		{"one model fleet: model only", []string{l4}, &Fleet{Models: []Model{{Name: l4, Devices: 4, BandwidthGBps: 300, FP32GFLOPS: 30300}}}, map[string]string{ModelLabel: "NVIDIA-L4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := NodeLabels(tc.models, tc.fleet); !maps.Equal(got, tc.want) {
				t.Errorf("NodeLabels = %v, want %v", got, tc.want)
			}
		})
	}
}
