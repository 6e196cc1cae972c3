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

package recipe

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/prismgpu/prism/internal/plugin/profiling"
)

// profilingShim compiles the preload library that profiled workloads load
// (internal/plugin/profiling), so that the plugin needs no compiler on the node. It runs
// inside the workload containers, against their glibc: CUDA programs are
// glibc-based, and the shim uses only long-standing libc calls.
func (b *builder) profilingShim(p v1.Platform) layerSpec {
	return layerSpec{
		createdBy: "prism: cc -shared internal/plugin/profiling/shim/prism-profile.c -> /" + ProfilingShimPath,
		entries: func(ctx context.Context) ([]entry, error) {
			cc := "gcc"
			if p.Architecture != runtime.GOARCH {
				var err error
				if cc, err = crossCC(p); err != nil {
					return nil, fmt.Errorf("the profiling shim is C: %w", err)
				}
			}
			dir, err := os.MkdirTemp("", "prism-shim-")
			if err != nil {
				return nil, err
			}
			defer os.RemoveAll(dir)
			if err := os.WriteFile(filepath.Join(dir, "prism-profile.c"), profiling.ShimSource(), 0o644); err != nil {
				return nil, err
			}
			// Relative names and -s keep the temporary directory out of
			// the output, so a rebuild is byte-identical.
			cmd := exec.CommandContext(ctx, cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-s", "-o", profiling.ShimName, "prism-profile.c")
			cmd.Dir = dir
			if out, err := cmd.CombinedOutput(); err != nil {
				return nil, fmt.Errorf("compiling the profiling shim with %s: %w\n%s", cc, err, out)
			}
			data, err := os.ReadFile(filepath.Join(dir, profiling.ShimName))
			if err != nil {
				return nil, err
			}
			return []entry{{path: ProfilingShimPath, kind: kindFile, mode: 0o644, data: data}}, nil
		},
	}
}
