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

package nodelabels

import (
	"encoding/json"
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/fleet/fleettest"
)

var (
	h100 = fleettest.GPU{Product: "NVIDIA H100 80GB HBM3", BandwidthGBps: 3350, FP32GFLOPS: 66900}
	a100 = fleettest.GPU{Product: "NVIDIA A100-SXM4-40GB", BandwidthGBps: 1555, FP32GFLOPS: 19500}
	l4   = fleettest.GPU{Product: "NVIDIA L4", BandwidthGBps: 300, FP32GFLOPS: 30300}
)

// slice is what the kubelet plugin on node publishes.
func slice(uid, node string, generation int64, gpus ...fleettest.GPU) *resourceapi.ResourceSlice {
	s := fleettest.Slice(uid, "gpu.prism.dev", node, generation, gpus...)
	s.Spec.NodeName = ptr.To(node)
	return s
}

// The fleet changes as slices come and go; each case checks the patch the
// labeller sends a node that carries current.
func TestPatchFollowsTheFleet(t *testing.T) {
	h100Labels := map[string]string{"gpu.prism.dev/model": "NVIDIA-H100-80GB-HBM3", "gpu.prism.dev/bandwidth-class": "1", "gpu.prism.dev/fp32-class": "1"}
	for _, tc := range []struct {
		name    string
		events  func(v *fleet.View)
		node    string
		current map[string]string
		// want is the labels part of the merge patch; nil: no patch.
		want map[string]*string
	}{
		{"one-model node gets its model and classes", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100, h100), true)
			v.OnAdd(slice("b", "gpu-l4", 1, l4), true)
		}, "gpu-h100", map[string]string{"kubernetes.io/hostname": "gpu-h100"},
			map[string]*string{"gpu.prism.dev/model": ptr.To("NVIDIA-H100-80GB-HBM3"), "gpu.prism.dev/bandwidth-class": ptr.To("1"), "gpu.prism.dev/fp32-class": ptr.To("1")}},
		{"labels already right: no patch", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100, h100), true)
			v.OnAdd(slice("b", "gpu-l4", 1, l4), true)
		}, "gpu-h100", h100Labels, nil},
		{"mixed node gets none", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-mixed", 1, h100, l4), true)
		}, "gpu-mixed", map[string]string{"kubernetes.io/hostname": "gpu-mixed"}, nil},
		{"node that becomes mixed loses its labels", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100), true)
			v.OnUpdate(nil, slice("a", "gpu-h100", 1, h100, l4))
		}, "gpu-h100", h100Labels,
			map[string]*string{"gpu.prism.dev/model": nil, "gpu.prism.dev/bandwidth-class": nil, "gpu.prism.dev/fp32-class": nil}},
		{"node that loses its slice loses its labels", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100), true)
			v.OnAdd(slice("b", "gpu-l4", 1, l4), true)
			v.OnDelete(slice("a", "gpu-h100", 1, h100))
		}, "gpu-h100", h100Labels,
			map[string]*string{"gpu.prism.dev/model": nil, "gpu.prism.dev/bandwidth-class": nil, "gpu.prism.dev/fp32-class": nil}},
		{"model changes: label follows, a class the new cut lacks is removed", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100), true)
			v.OnAdd(slice("b", "gpu-l4", 1, l4), true)
			// The node is reinstalled with L4s: a one-model fleet has no classes.
			v.OnAdd(slice("a2", "gpu-h100", 2, l4), true)
		}, "gpu-h100", h100Labels,
			map[string]*string{"gpu.prism.dev/model": ptr.To("NVIDIA-L4"), "gpu.prism.dev/bandwidth-class": nil, "gpu.prism.dev/fp32-class": nil}},
		{"a new model moves another node's class", func(v *fleet.View) {
			v.OnAdd(slice("a", "gpu-h100", 1, h100), true)
			v.OnAdd(slice("b", "gpu-l4", 1, l4), true)
			v.OnAdd(slice("c", "gpu-a100", 1, a100), true)
		}, "gpu-l4", map[string]string{"gpu.prism.dev/model": "NVIDIA-L4", "gpu.prism.dev/bandwidth-class": "2", "gpu.prism.dev/fp32-class": "2"},
			map[string]*string{"gpu.prism.dev/bandwidth-class": ptr.To("3")}},
		{"other labels are never touched", func(v *fleet.View) {}, "cpu-node",
			map[string]string{"gpu.prism.dev/other": "x", "team": "a"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := fleet.NewView()
			tc.events(v)
			desired := Desired(v.NodeModels(), v.Fleet())
			patch := Patch(tc.current, desired[tc.node])
			if tc.want == nil {
				if patch != nil {
					t.Errorf("patch %s, want none", patch)
				}
				return
			}
			var got struct {
				Metadata struct {
					Labels map[string]*string `json:"labels"`
				} `json:"metadata"`
			}
			if err := json.Unmarshal(patch, &got); err != nil {
				t.Fatalf("patch %q: %v", patch, err)
			}
			if !reflect.DeepEqual(got.Metadata.Labels, tc.want) {
				t.Errorf("patch %s, want labels %v", patch, printable(tc.want))
			}
		})
	}
}

func printable(m map[string]*string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		out[k] = "null"
		if v != nil {
			out[k] = *v
		}
	}
	return out
}

func TestChanged(t *testing.T) {
	node := func(labels map[string]string) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Labels: labels}}
	}
	owned := map[string]string{"gpu.prism.dev/model": "NVIDIA-L4"}
	for _, tc := range []struct {
		name     string
		old, new *corev1.Node
		want     bool
	}{
		{"owned label removed", node(owned), node(nil), true},
		{"owned label changed", node(owned), node(map[string]string{"gpu.prism.dev/model": "x"}), true},
		{"other label changed", node(owned), node(map[string]string{"gpu.prism.dev/model": "NVIDIA-L4", "team": "b"}), false},
	} {
		if got := Changed(tc.old, tc.new); got != tc.want {
			t.Errorf("%s: Changed = %v, want %v", tc.name, got, tc.want)
		}
	}
}
