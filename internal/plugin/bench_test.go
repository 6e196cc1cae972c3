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

package plugin

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/prismgpu/prism/internal/plugin/mps/mpstest"
)

// BenchmarkPrepareUnprepare is the plugin's own share of a kubelet call, on
// real files in a temporary directory: no gRPC and no API server GET.
func BenchmarkPrepareUnprepare(b *testing.B) {
	d := newTestDriver(b, "h100-sxm-8.yaml", b.TempDir())
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		uid := fmt.Sprintf("bench-%d", i)
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{allocatedClaim(uid, []string{"gpu-0"})})
		if err != nil || res[types.UID(uid)].Err != nil {
			b.Fatal(err, res[types.UID(uid)].Err)
		}
		if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPrepareUnprepareMPSShare is BenchmarkPrepareUnprepare for a share
// that MPS enforces, under the stand-in nvidia-cuda-mps-control: each
// prepare starts the share's own daemon and sets and reads back its two
// limits, each unprepare tells the daemon to quit and waits for it. Read
// it against BenchmarkPrepareUnprepare from the same run; a real daemon's
// start may take longer than the stand-in's.
func BenchmarkPrepareUnprepareMPSShare(b *testing.B) {
	root := b.TempDir()
	if err := mpstest.Build(mpstest.Binary(root)); err != nil {
		b.Fatal(err)
	}
	b.Setenv("FAKE_MPS_CONTROL_RECORD", filepath.Join(b.TempDir(), "record"))
	d := newTestDriverWith(b, "h100-sxm-8.yaml", b.TempDir(), func(c *Config) { c.MPSDriverRoot = root })
	ctx := context.Background()
	for i := 0; b.Loop(); i++ {
		uid := fmt.Sprintf("bench-%d", i)
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{computeShare(uid, 40, "8Gi")})
		if err != nil || res[types.UID(uid)].Err != nil {
			b.Fatal(err, res[types.UID(uid)].Err)
		}
		if n := len(d.state.checkpoint.MPSDaemons()); n != 1 {
			b.Fatalf("%d MPS daemons after the share's prepare, want its own", n)
		}
		if _, err := d.UnprepareResourceClaims(ctx, []kubeletplugin.NamespacedObject{{UID: types.UID(uid)}}); err != nil {
			b.Fatal(err)
		}
	}
}
