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

package explaincmd

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/internal/goldentest"
)

func TestExplainClaim(t *testing.T) {
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ml", Annotations: map[string]string{"prism.dev/rewrite": `{"profile":"p","action":"profile"}`}},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.prism.dev"},
		}}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.prism.dev", Pool: "n1", Device: "gpu-0"}},
		}}},
	}
	slice := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "gpu.prism.dev", NodeName: ptr.To("n1"), Pool: resourceapi.ResourcePool{Name: "n1", Generation: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0", Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{"productName": {StringValue: ptr.To("NVIDIA L4")}}}}},
	}
	class := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.prism.dev"}}
	twoGPUs := slice.DeepCopy()
	twoGPUs.Spec.Devices = append(twoGPUs.Spec.Devices, resourceapi.Device{Name: "gpu-1"})
	other := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "other", Namespace: "team-b"},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: "gpu.prism.dev", Pool: "n1", Device: "gpu-1"}},
		}}},
	}

	profiled := map[string]string{"prism.dev/profile": "train"}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer-0", Namespace: "ml", UID: "pod-uid", Annotations: profiled},
		Spec:       corev1.PodSpec{ResourceClaims: []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To("trainer-gpu")}}},
	}
	tmpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: "trainer-gpu", Namespace: "ml", Annotations: profiled}}
	generated := claim.DeepCopy()
	generated.Name, generated.Annotations = "trainer-0-gpu-x2k", map[string]string{"resource.kubernetes.io/pod-claim-name": "gpu"}
	generated.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: "trainer-0", UID: "pod-uid", Controller: ptr.To(true)}}

	badName := claim.DeepCopy()
	badName.Annotations = map[string]string{"prism.dev/profile": "Train"}

	tests := []struct {
		name    string
		objects []runtime.Object
		claim   string
		want    []string
	}{
		{name: "allocated claim", objects: []runtime.Object{claim, slice, class}, claim: "c",
			want: []string{"Claim:    ml/c", "Rewrite:  none, this run is profiled instead", "n1    gpu-0   NVIDIA L4  -      * gpu      -        matches gpu"}},
		{name: "device held by another claim", objects: []runtime.Object{claim, other, twoGPUs, class}, claim: "c",
			want: []string{"n1    gpu-1   -          -      -          team-b/other (whole GPU)  matches gpu, but team-b/other holds it"}},
		{name: "profile annotation on the pod and the template's metadata", objects: []runtime.Object{generated, pod, tmpl, slice, class}, claim: "trainer-0-gpu-x2k",
			want: []string{
				"Note:     prism.dev/profile=train on Pod trainer-0 is ignored",
				"Note:     prism.dev/profile=train on ResourceClaimTemplate trainer-gpu's own metadata is ignored",
			}},
		{name: "no devices", objects: []runtime.Object{claim, class}, claim: "c", want: []string{"No devices published by gpu.prism.dev."}},
		{name: "profile annotation that is no name", objects: []runtime.Object{badName, slice, class}, claim: "c",
			want: []string{`Profile:  none, prism.dev/profile "Train" is not a WorkloadProfile name`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := execute(tc.objects, "claim", tc.claim)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output does not contain %q:\n%s", w, out)
				}
			}
		})
	}
}

// execute runs prismctl explain with args on a cluster of objects, in
// namespace ml.
func execute(objects []runtime.Object, args ...string) (string, error) {
	cs := fake.NewClientset(objects...)
	return explaintest.Execute(newCommand(func() (kubernetes.Interface, string, error) { return cs, "ml", nil }), args...)
}

// TestExplainGolden pins the whole output for a rewritten claim: the plan
// in words only (its JSON is for -o json), and a GPU another claim holds
// whole through the default share of a shareable GPU; for a claim whose
// first choice was a share sized from its profile's usage, allocated next
// to another share; and on a node with an A100 in MIG mode whose two
// 3g.20gb partitions ml/job-a and ml/job-b hold, beside an A100 not in MIG
// mode: for job-a, the partition it was allocated; for job-c, asking for a
// 2g.10gb or else a whole GPU, why each partition and the MIG GPU are out
// of reach. UPDATE_GOLDEN=1 rewrites the files.
func TestExplainGolden(t *testing.T) {
	classes := explaintest.Objects(explaintest.Load[[]resourceapi.DeviceClass](t, "classes.json"))
	fleet := slices.Concat([]runtime.Object{explaintest.Load[*resourceapi.ResourceClaim](t, "claim.json")},
		explaintest.Objects(explaintest.Load[[]resourceapi.ResourceSlice](t, "slices.json")),
		classes,
		explaintest.Objects(explaintest.Load[[]resourceapi.ResourceClaim](t, "claims.json")))
	shared := append(slices.Clone(fleet), explaintest.Load[*resourceapi.ResourceClaim](t, "claim-shared.json"))
	jobC := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "job-c", Namespace: "ml"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpu", FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "small", DeviceClassName: "gpu.prism.dev", Selectors: []resourceapi.DeviceSelector{explaintest.ProfileSelector("2g.10gb")}},
				{Name: "whole", DeviceClassName: "gpu.prism.dev", Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: `!has(device.attributes["gpu.prism.dev"].migProfile)`,
				}}}},
			},
		}}}},
	}
	mig := slices.Concat([]runtime.Object{jobC}, explaintest.MIGObjects(t), classes)
	for _, tc := range []struct {
		name    string
		objects []runtime.Object
		args    []string
		golden  string
	}{
		{name: "text", objects: fleet, args: []string{"trainer-0-gpu"}, golden: "explain.txt"},
		{name: "json", objects: fleet, args: []string{"trainer-0-gpu", "-o", "json"}, golden: "explain.json"},
		{name: "share", objects: shared, args: []string{"tagger-0-gpu"}, golden: "explain-shared.txt"},
		{name: "MIG partition allocated", objects: mig, args: []string{"job-a", "--wide"}, golden: "explain-mig-allocated.txt"},
		{name: "MIG partitions out of reach", objects: mig, args: []string{"job-c", "--wide"}, golden: "explain-mig-blocked.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := execute(tc.objects, append([]string{"claim"}, tc.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			goldentest.Compare(t, filepath.Join("testdata", tc.golden), []byte(out))
		})
	}
}

// A failing explain writes nothing but the error.
func TestExplainErrors(t *testing.T) {
	unannotated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ml"}}
	broken := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "ml", Annotations: map[string]string{"prism.dev/rewrite": "{"}}}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "missing claim", args: []string{"claim", "c"}, wantErr: "getting ResourceClaim ml/c"},
		// It used to print the help and exit 0.
		{name: "unknown subcommand", args: []string{"foo"}, wantErr: `unknown command "foo"`},
		{name: "unknown format", args: []string{"claim", "plain", "-o", "yaml"}, wantErr: `--output must be text or json, not "yaml"`},
		{name: "json of a claim without a plan", args: []string{"claim", "plain", "-o", "json"}, wantErr: "ResourceClaim ml/plain has no prism.dev/rewrite annotation"},
		{name: "json of an annotation that is not JSON", args: []string{"claim", "broken", "-o", "json"}, wantErr: "prism.dev/rewrite annotation of ResourceClaim ml/broken is not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := execute([]runtime.Object{unannotated, broken}, tc.args...)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if out != "" {
				t.Errorf("wrote %q before failing", out)
			}
		})
	}
}
