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

package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prismgpu/prism/internal/sim"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"
)

// BenchmarkPlainAllocate runs the plain claim alone over the 500-node mixed
// fleet, one Allocate per node per iteration: what a CPU profile of the
// allocator library is taken on, to see where a plain claim's time goes.
func BenchmarkPlainAllocate(b *testing.B) {
	ctx := context.Background()
	f, err := NewMixedFleet(ctx, "", 500, 8)
	if err != nil {
		b.Fatal(err)
	}
	a, err := newAllocator(ctx, f.Slices)
	if err != nil {
		b.Fatal(err)
	}
	c := claim(sim.GPUClaim(1))
	for n := range f.Nodes {
		_, _ = a.Allocate(ctx, f.Nodes[n], []*resourceapi.ResourceClaim{c})
	}
	b.ResetTimer()
	for b.Loop() {
		for n := range f.Nodes {
			if _, err := a.Allocate(ctx, f.Nodes[n], []*resourceapi.ResourceClaim{c}); err != nil {
				b.Fatal(err)
			}
		}
	}
}

// TestClassesAreTheShippedOnes: the bench measures the DeviceClasses users
// install, so GPUClass and TierClass must be those of
// deployments/static/deviceclasses.yaml, selectors and all.
func TestClassesAreTheShippedOnes(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "deployments", "static", "deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	shipped := map[string]resourceapi.DeviceClassSpec{}
	for _, doc := range strings.Split(string(data), "\n---") {
		var c resourceapi.DeviceClass
		if err := yaml.Unmarshal([]byte(doc), &c); err != nil {
			t.Fatal(err)
		}
		shipped[c.Name] = c.Spec
	}
	for _, c := range []*resourceapi.DeviceClass{GPUClass(), TierClass()} {
		want, ok := shipped[c.Name]
		if !ok {
			t.Errorf("no DeviceClass %s in deviceclasses.yaml", c.Name)
			continue
		}
		for i := range want.Selectors {
			if cel := want.Selectors[i].CEL; cel != nil {
				cel.Expression = strings.TrimSpace(cel.Expression)
			}
		}
		if diff := cmp.Diff(want, c.Spec); diff != "" {
			t.Errorf("DeviceClass %s (-shipped +bench):\n%s", c.Name, diff)
		}
	}
}
