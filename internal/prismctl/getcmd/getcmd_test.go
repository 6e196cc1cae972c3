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
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/prismgpu/prism/internal/explain/explaintest"
	"github.com/prismgpu/prism/internal/goldentest"
)

// The fake client does not filter by field selector, so the fixtures hold
// only slices of the Prism driver. The fleet has a GPU held whole on a
// node whose GPUs are not shareable (node-a), memory shares (node-b), and
// the default share of a shareable GPU, which is the whole GPU (node-c).
// The MIG node has an A100 in MIG mode with two 3g.20gb partitions held,
// one row with its partitions summed up, beside an A100 not in MIG mode.
// UPDATE_GOLDEN=1 rewrites the golden files.
func TestGetGPUs(t *testing.T) {
	objects := append(explaintest.Objects(explaintest.Load[[]resourceapi.ResourceSlice](t, "slices.json")),
		explaintest.Objects(explaintest.Load[[]resourceapi.ResourceClaim](t, "claims.json"))...)
	tests := []struct {
		name    string
		objects []runtime.Object
		golden  string
	}{
		{name: "fleet", objects: objects, golden: "gpus.txt"},
		{name: "no GPUs", golden: "no-gpus.txt"},
		{name: "MIG node", objects: explaintest.MIGObjects(t), golden: "gpus-mig.txt"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cs := fake.NewClientset(tc.objects...)
			out, err := explaintest.Execute(newCommand(func() (kubernetes.Interface, string, error) { return cs, "", nil }), "gpus")
			if err != nil {
				t.Fatal(err)
			}
			goldentest.Compare(t, filepath.Join("testdata", tc.golden), []byte(out))
		})
	}
}
