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
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/prismgpu/prism/pkg/explain/explaintest"
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

	tests := []struct {
		name    string
		objects []runtime.Object
		claim   string
		want    []string
		wantErr string
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
		{name: "missing claim", objects: []runtime.Object{slice}, claim: "c", wantErr: "getting ResourceClaim ml/c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(tc.objects...)
			cmd := newCommand(func() (kubernetes.Interface, string, error) { return cs, "ml", nil })
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&bytes.Buffer{})
			cmd.SilenceUsage = true
			cmd.SetArgs([]string{"claim", tc.claim})
			err := cmd.Execute()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output does not contain %q:\n%s", w, out.String())
				}
			}
		})
	}
}

func load[T any](t *testing.T, name string) T {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var v T
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

// TestExplainGolden pins the whole output for a rewritten claim: the plan
// in words only (its JSON is for -o json), and a GPU another claim holds
// whole through the default share of a shareable GPU; and for a claim whose
// first choice was a share sized from its profile's usage, allocated next
// to another share. UPDATE_GOLDEN=1 rewrites the files.
func TestExplainGolden(t *testing.T) {
	objects := []runtime.Object{load[*resourceapi.ResourceClaim](t, "claim.json")}
	for _, s := range load[[]resourceapi.ResourceSlice](t, "slices.json") {
		objects = append(objects, &s)
	}
	for _, c := range load[[]resourceapi.DeviceClass](t, "classes.json") {
		objects = append(objects, &c)
	}
	for _, c := range load[[]resourceapi.ResourceClaim](t, "claims.json") {
		objects = append(objects, &c)
	}
	for _, tc := range []struct {
		name   string
		args   []string
		extra  string // a claim file added to the cluster
		golden string
	}{
		{name: "text", args: []string{"trainer-0-gpu"}, golden: "explain.txt"},
		{name: "json", args: []string{"trainer-0-gpu", "-o", "json"}, golden: "explain.json"},
		{name: "share", args: []string{"tagger-0-gpu"}, extra: "claim-shared.json", golden: "explain-shared.txt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objects := objects
			if tc.extra != "" {
				objects = append(slices.Clone(objects), load[*resourceapi.ResourceClaim](t, tc.extra))
			}
			cs := fake.NewClientset(objects...)
			cmd := newCommand(func() (kubernetes.Interface, string, error) { return cs, "ml", nil })
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs(append([]string{"claim"}, tc.args...))
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), out.String()); diff != "" {
				t.Errorf("explain claim output (-want +got):\n%s", diff)
			}
		})
	}
}

// TestExplainMIGGolden pins the output on a node with an A100 in MIG mode
// whose two 3g.20gb partitions ml/job-a and ml/job-b hold, beside an A100
// not in MIG mode: for job-a, the partition it was allocated; for job-c,
// asking for a 2g.10gb or else a whole GPU, why each partition and the
// MIG GPU are out of reach. UPDATE_GOLDEN=1 rewrites the files.
func TestExplainMIGGolden(t *testing.T) {
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
	objects := []runtime.Object{jobC}
	for _, s := range explaintest.MIGSlices(t) {
		objects = append(objects, &s)
	}
	for _, c := range explaintest.MIGClaims() {
		objects = append(objects, &c)
	}
	for _, c := range load[[]resourceapi.DeviceClass](t, "classes.json") {
		objects = append(objects, &c)
	}
	for _, tc := range []struct {
		claim, golden string
	}{
		{claim: "job-a", golden: "explain-mig-allocated.txt"},
		{claim: "job-c", golden: "explain-mig-blocked.txt"},
	} {
		t.Run(tc.claim, func(t *testing.T) {
			cs := fake.NewClientset(objects...)
			cmd := newCommand(func() (kubernetes.Interface, string, error) { return cs, "ml", nil })
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs([]string{"claim", tc.claim, "--wide"})
			if err := cmd.Execute(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.golden)
			if os.Getenv("UPDATE_GOLDEN") != "" {
				if err := os.WriteFile(path, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(string(want), out.String()); diff != "" {
				t.Errorf("explain claim output (-want +got):\n%s", diff)
			}
		})
	}
}

func TestExplainOutputFlag(t *testing.T) {
	unannotated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "ml"}}
	broken := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "broken", Namespace: "ml", Annotations: map[string]string{"prism.dev/rewrite": "{"}}}
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "unknown format", args: []string{"claim", "plain", "-o", "yaml"}, wantErr: `--output must be text or json, not "yaml"`},
		{name: "json of a claim without a plan", args: []string{"claim", "plain", "-o", "json"}, wantErr: "ResourceClaim ml/plain has no prism.dev/rewrite annotation"},
		{name: "json of an annotation that is not JSON", args: []string{"claim", "broken", "-o", "json"}, wantErr: "prism.dev/rewrite annotation of ResourceClaim ml/broken is not JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(unannotated, broken)
			cmd := newCommand(func() (kubernetes.Interface, string, error) { return cs, "ml", nil })
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&bytes.Buffer{})
			cmd.SilenceUsage = true
			cmd.SetArgs(tc.args)
			if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
			if out.Len() != 0 {
				t.Errorf("wrote %q before failing", out.String())
			}
		})
	}
}

// `prismctl explain foo` used to print the help and exit 0.
func TestExplainRejectsUnknownSubcommand(t *testing.T) {
	cmd := newCommand(func() (kubernetes.Interface, string, error) { return fake.NewClientset(), "ml", nil })
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"foo"})
	if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), `unknown command "foo"`) {
		t.Errorf("error %v, want unknown command", err)
	}
}
