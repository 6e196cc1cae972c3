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

package profilecmd

import (
	"bytes"
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

func fixture(name string) string {
	return filepath.Join("..", "..", "..", "pkg", "ncu", "testdata", name)
}

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	s := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(s); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(s).WithStatusSubresource(&v1alpha1.WorkloadProfile{}).WithObjects(objs...).Build()
}

func run(t *testing.T, newClient clientFunc, args ...string) (string, error) {
	t.Helper()
	cmd := newCommand(newClient)
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

func TestImportCreatesThenUpdates(t *testing.T) {
	c := fakeClient(t)
	newClient := func() (client.Client, string, error) { return c, "ml", nil }

	out, err := run(t, newClient, "import", "--name", "train", "-f", fixture("vectoradd_raw.csv"), "--ncu-version", "2025.3.1.0", "--device", "NVIDIA H100 80GB HBM3")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "workloadprofile.prism.dev/train imported: MemoryBound") {
		t.Errorf("output %q", out)
	}
	wp := &v1alpha1.WorkloadProfile{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ml", Name: "train"}, wp); err != nil {
		t.Fatal(err)
	}
	st := wp.Status
	if st.BoundType != v1alpha1.BoundTypeMemoryBound || st.SMThroughputMilliPercent == nil || *st.SMThroughputMilliPercent != 33_550 ||
		st.NCUVersion != "2025.3.1.0" || st.Source == nil || st.Source.Type != v1alpha1.ProfileSourceImport {
		t.Errorf("status after import: %+v", st)
	}

	// A user pins the spec; a second import must keep it and replace the
	// numbers.
	wp.Spec.MinComputeCapability = "9.0"
	if err := c.Update(context.Background(), wp); err != nil {
		t.Fatal(err)
	}
	if _, err := run(t, newClient, "import", "--name", "train", "-n", "ml", "-f", fixture("fmaloop_details.csv")); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "ml", Name: "train"}, wp); err != nil {
		t.Fatal(err)
	}
	if wp.Spec.MinComputeCapability != "9.0" || wp.Status.BoundType != v1alpha1.BoundTypeComputeBound {
		t.Errorf("after re-import: spec %+v, bound %s", wp.Spec, wp.Status.BoundType)
	}
}

func TestImportDryRun(t *testing.T) {
	noClient := func() (client.Client, string, error) { return nil, "", errors.New("dry run must not connect") }
	out, err := run(t, noClient, "import", "--name", "tiny", "-n", "bench", "-f", fixture("tinygrid_details.csv"), "--dry-run", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var wp v1alpha1.WorkloadProfile
	if err := yaml.UnmarshalStrict([]byte(out), &wp); err != nil {
		t.Fatalf("output is not a WorkloadProfile: %v\n%s", err, out)
	}
	if wp.Kind != "WorkloadProfile" || wp.APIVersion != "prism.dev/v1alpha1" || wp.Name != "tiny" || wp.Namespace != "bench" ||
		wp.Status.BoundType != v1alpha1.BoundTypeLatencyBound {
		t.Errorf("dry run printed %+v", wp)
	}
}

func TestImportErrors(t *testing.T) {
	c := fakeClient(t)
	newClient := func() (client.Client, string, error) { return c, "", nil }
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no name", []string{"import", "-f", fixture("vectoradd_raw.csv")}, `"name" not set`},
		{"missing file", []string{"import", "--name", "x", "-f", "does-not-exist.csv"}, "opening report"},
		{"bad output", []string{"import", "--name", "x", "-f", fixture("vectoradd_raw.csv"), "-o", "table"}, "--output must be yaml or json"},
		{"not a report", []string{"import", "--name", "x", "-f", "profilecmd.go"}, "parsing ncu report"},
	}
	for _, tc := range tests {
		_, err := run(t, newClient, tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to contain %q", tc.name, err, tc.want)
		}
	}
}

func TestShow(t *testing.T) {
	c := fakeClient(t)
	newClient := func() (client.Client, string, error) { return c, "default", nil }
	if _, err := run(t, newClient, "import", "--name", "mix", "-f", fixture("mixed_raw.csv"), "--ncu-version", "2025.3.1.0"); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, newClient, "show", "mix")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"Bound:", "MemoryBound",
		"SM throughput:", "45.16%",
		"Memory throughput:", "65.073%",
		"ncu version:", "2025.3.1.0",
		"GPU time:", "731.84µs",
		"Top kernels:",
		"79.042%  2", "vectorAdd(const float *, const float *, float *, int)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q:\n%s", want, out)
		}
	}

	if _, err := run(t, newClient, "show", "absent"); err == nil || !strings.Contains(err.Error(), "default/absent") {
		t.Errorf("show of a missing profile: err = %v", err)
	}
}

func TestDescribeUnprofiled(t *testing.T) {
	var out bytes.Buffer
	wp := &v1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: "new", Namespace: "ml"}}
	if err := Describe(&out, wp); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "(not profiled)") || strings.Contains(out.String(), "Top kernels") {
		t.Errorf("Describe of an empty profile:\n%s", out.String())
	}
}
