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

package getcmd

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prismgpu/prism/pkg/explain/explaintest"
)

func load[T any](t *testing.T, name string) []T {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []T
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return out
}

// The fake client does not filter by field selector, so the fixtures hold
// only slices of the Prism driver. The fleet has a GPU held whole on a
// node whose GPUs are not shareable (node-a), memory shares (node-b), and
// the default share of a shareable GPU, which is the whole GPU (node-c).
// The MIG node has an A100 in MIG mode with two 3g.20gb partitions held,
// one row with its partitions summed up, beside an A100 not in MIG mode.
// UPDATE_GOLDEN=1 rewrites the golden files.
func TestGetGPUs(t *testing.T) {
	var objects []runtime.Object
	for _, s := range load[resourceapi.ResourceSlice](t, "slices.json") {
		objects = append(objects, &s)
	}
	for _, c := range load[resourceapi.ResourceClaim](t, "claims.json") {
		objects = append(objects, &c)
	}
	var mig []runtime.Object
	for _, s := range explaintest.MIGSlices(t) {
		mig = append(mig, &s)
	}
	for _, c := range explaintest.MIGClaims() {
		mig = append(mig, &c)
	}
	tests := []struct {
		name    string
		objects []runtime.Object
		golden  string
	}{
		{name: "fleet", objects: objects, golden: "gpus.txt"},
		{name: "no GPUs", golden: "no-gpus.txt"},
		{name: "MIG node", objects: mig, golden: "gpus-mig.txt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(tc.objects...)
			cmd := newCommand(func() (kubernetes.Interface, error) { return cs, nil })
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs([]string{"gpus"})
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
				t.Errorf("get gpus output (-want +got):\n%s", diff)
			}
		})
	}
}
