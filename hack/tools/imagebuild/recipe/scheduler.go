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
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// SchedulerPath is where the prism-scheduler image keeps the patched
// kube-scheduler.
const SchedulerPath = "usr/bin/prism-scheduler"

// schedulerPatchGlob finds the allocator patch the scheduler is built with.
const schedulerPatchGlob = "hack/upstream/dynamic-resource-allocation-*.patch"

// scheduler is prism-scheduler: the test bed's kube-scheduler with the
// allocator patch (docs/upstream-allocator.md). hack/upstream-allocator.sh
// builds it and caches it by its inputs (patch, hack/tools/kube's pins, Go,
// platform), so that the image builder and the benchmarks share one build and
// its rules; a cold build takes minutes. It is an input here, like a Debian
// package: --no-cache recompresses its layer but does not rebuild it.
func (b *builder) scheduler(p v1.Platform) layerSpec {
	return layerSpec{
		createdBy: "prism: hack/upstream-allocator.sh scheduler -> /" + SchedulerPath,
		entries: func(ctx context.Context) ([]entry, error) {
			patches, err := filepath.Glob(filepath.Join(b.o.RepoRoot, schedulerPatchGlob))
			if err != nil || len(patches) != 1 {
				return nil, fmt.Errorf("want one allocator patch %s, found %v (%v)", schedulerPatchGlob, patches, err)
			}
			patch, err := os.ReadFile(patches[0])
			if err != nil {
				return nil, err
			}
			b.labels["dev.prism.scheduler.patch"] = fmt.Sprintf("%s sha256:%x", filepath.Base(patches[0]), sha256.Sum256(patch))

			cmd := exec.CommandContext(ctx, filepath.Join(b.o.RepoRoot, "hack", "upstream-allocator.sh"), "scheduler")
			cmd.Dir = b.o.RepoRoot
			cmd.Env = append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Architecture)
			if p.Architecture == "arm" && p.Variant != "" {
				cmd.Env = append(cmd.Env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
			}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			start := time.Now()
			if err := cmd.Run(); err != nil {
				return nil, fmt.Errorf("hack/upstream-allocator.sh scheduler: %w\n%s", err, lastLines(stderr.String(), 30))
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			bin := lines[len(lines)-1]
			b.log("%s (%s)", strings.TrimSpace(lastLines(stderr.String(), 1)), time.Since(start).Round(100*time.Millisecond))
			data, err := os.ReadFile(bin)
			if err != nil {
				return nil, fmt.Errorf("reading the scheduler hack/upstream-allocator.sh built: %w", err)
			}
			return []entry{{path: SchedulerPath, kind: kindFile, mode: 0o755, data: data}}, nil
		},
	}
}
