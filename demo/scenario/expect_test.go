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

package scenario

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

// testRunner is a runner whose cluster holds testdata/cluster.yaml, with
// its slices loaded as observe loads them.
func testRunner(t *testing.T) *runner {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, doc := range splitDocs(data) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			t.Fatal(err)
		}
		var obj runtime.Object
		switch meta.Kind {
		case "ResourceSlice":
			obj = &resourceapi.ResourceSlice{}
		case "ResourceClaim":
			obj = &resourceapi.ResourceClaim{}
		default:
			t.Fatalf("testdata/cluster.yaml: unexpected kind %q", meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, obj); err != nil {
			t.Fatal(err)
		}
		objs = append(objs, obj)
	}
	r := &runner{client: fake.NewClientset(objs...)}
	if err := r.loadSlices(t.Context()); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCheck pins the expect-* annotations a spec can write to the problems
// the runner reports for what a pod got.
func TestCheck(t *testing.T) {
	r := testRunner(t)
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		node        string
		claim       string // the pod's ResourceClaim in testdata/cluster.yaml
		ids         []string
		want        []string
	}{{
		name:        "product and class held",
		annotations: map[string]string{"demo.prism.dev/expect-product": "NVIDIA H100 80GB HBM3", "demo.prism.dev/expect-class": "ultra"},
		ids:         []string{"gpu-h100/gpu-0"},
	}, {
		name:        "product missed",
		annotations: map[string]string{"demo.prism.dev/expect-product": "NVIDIA H100 80GB HBM3"},
		ids:         []string{"gpu-l4/gpu-0"},
		want:        []string{`gpu-l4/gpu-0: productName is "NVIDIA L4", want "NVIDIA H100 80GB HBM3"`},
	}, {
		name:        "an attribute with no GPU",
		annotations: map[string]string{"demo.prism.dev/expect-class": "ultra"},
		want:        []string{`no GPU, want bandwidthClass "ultra"`},
	}, {
		name:        "count and node",
		annotations: map[string]string{"demo.prism.dev/expect-gpus": "2", "demo.prism.dev/expect-node": "gpu-h100"},
		node:        "gpu-l4",
		ids:         []string{"gpu-l4/gpu-0"},
		want:        []string{"got 1 GPUs, want 2", "on node gpu-l4, want gpu-h100"},
	}, {
		name:        "a partition of its profile",
		annotations: map[string]string{"demo.prism.dev/expect-mig-profile": "2g.10gb"},
		ids:         []string{"gpu-mig/gpu-0-mig-2g10gb-0"},
	}, {
		name:        "an empty profile wants a whole GPU",
		annotations: map[string]string{"demo.prism.dev/expect-mig-profile": ""},
		ids:         []string{"gpu-mig/gpu-0-mig-2g10gb-0"},
		want:        []string{`gpu-mig/gpu-0-mig-2g10gb-0: migProfile is "2g.10gb", want ""`},
	}, {
		name:        "a whole GPU in MIG mode",
		annotations: map[string]string{"demo.prism.dev/expect-mig-profile": ""},
		ids:         []string{"gpu-mig/gpu-0"},
	}, {
		name:        "one NVLink domain",
		annotations: map[string]string{"demo.prism.dev/expect-same-nvlink-domain": "true"},
		ids:         []string{"gpu-h100/gpu-0", "gpu-h100/gpu-1"},
	}, {
		name:        "no NVLink domain",
		annotations: map[string]string{"demo.prism.dev/expect-same-nvlink-domain": "true"},
		ids:         []string{"gpu-h100/gpu-0", "gpu-l4/gpu-0"},
		want:        []string{"NVLink domains [fabric-a ] of [gpu-h100/gpu-0 gpu-l4/gpu-0], want one shared domain"},
	}, {
		name:        "a device it must not get, by name",
		annotations: map[string]string{"demo.prism.dev/expect-not-device": "gpu-0"},
		ids:         []string{"gpu-l4/gpu-0"},
		want:        []string{"got gpu-l4/gpu-0, want any GPU but gpu-0"},
	}, {
		name:        "why: a partition through its tier",
		annotations: map[string]string{"demo.prism.dev/expect-why": "-> tier mig-2g10gb"},
		claim:       "mig-light-gpu",
		ids:         []string{"gpu-mig/gpu-0-mig-2g10gb-0"},
	}, {
		name:        "why: a profiling run is no rewrite",
		annotations: map[string]string{"demo.prism.dev/expect-why": "MemoryBound"},
		claim:       "stream-gpu",
		ids:         []string{"gpu-l4/gpu-0"},
		want:        []string{`placement reason "profile \"stream\" not measured yet: profiling run" lacks "MemoryBound"`},
	}, {
		name:        "unknown expectation",
		annotations: map[string]string{"demo.prism.dev/expect-colour": "green"},
		want:        []string{"unknown expectation demo.prism.dev/expect-colour"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: Namespace, Annotations: tc.annotations},
				Spec:       corev1.PodSpec{NodeName: tc.node},
			}
			if tc.claim != "" {
				pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimName: ptr.To(tc.claim)}}
			}
			if diff := cmp.Diff(tc.want, r.check(pod, tc.ids)); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCheckPair pins the expectations that name another pod of the step.
func TestCheckPair(t *testing.T) {
	got := map[string][]string{
		"a":     {"gpu-h100/gpu-0"},
		"b":     {"gpu-h100/gpu-0"},
		"c":     {"gpu-h100/gpu-1"},
		"ghost": nil,
	}
	for _, tc := range []struct {
		name, pod   string
		annotations map[string]string
		want        []string
	}{{
		name: "same GPU as", pod: "b",
		annotations: map[string]string{"demo.prism.dev/expect-same-gpu-as": "a"},
	}, {
		name: "not the same GPU", pod: "c",
		annotations: map[string]string{"demo.prism.dev/expect-same-gpu-as": "a"},
		want:        []string{"got [gpu-h100/gpu-1], want the same GPU as a [gpu-h100/gpu-0]"},
	}, {
		name: "different GPU from", pod: "c",
		annotations: map[string]string{"demo.prism.dev/expect-different-gpu-from": "a"},
	}, {
		name: "the other's GPU", pod: "b",
		annotations: map[string]string{"demo.prism.dev/expect-different-gpu-from": "a"},
		want:        []string{"got gpu-h100/gpu-0, which a has too; want a different GPU"},
	}, {
		name: "no GPU to differ from", pod: "ghost",
		annotations: map[string]string{"demo.prism.dev/expect-different-gpu-from": "a"},
		want:        []string{"got [], want a GPU other than a's [gpu-h100/gpu-0]"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, checkPair(tc.pod, tc.annotations, got)); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}
