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
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

// BenchmarkPlainAllocate runs the plain claim alone over the 500-node mixed
// fleet, one Allocate per node per iteration: what a CPU profile of either
// library (-modfile=_output/upstream/go.mod) is taken on, to see where a
// plain claim's time goes (docs/upstream-allocator.md). The ratio between
// the libraries comes from prism-bench --patched-bench, not from here.
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
	c := claim(GPUSpec(1))
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
