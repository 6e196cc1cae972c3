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
