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

package profiling

import (
	"context"
	_ "embed"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/klog/v2"
)

// ShimName is the file name of the compiled preload library.
const ShimName = "libprism-profile.so"

//go:embed shim/prism-profile.c
var shimSource []byte

// ShimSource returns the C source of the preload library, so that an image
// build can compile it for the node's libc without a copy of this
// repository.
func ShimSource() []byte {
	return append([]byte(nil), shimSource...)
}

// BuildShim compiles the preload library into outDir and returns its path.
// The compiler is $CC, or gcc. Image builds and tests use it, and the plugin
// falls back to it at start-up when --profiling-shim does not exist.
func BuildShim(ctx context.Context, outDir string) (string, error) {
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("creating shim output directory: %w", err)
	}
	src := filepath.Join(outDir, "prism-profile.c")
	if err := os.WriteFile(src, shimSource, 0o644); err != nil {
		return "", fmt.Errorf("writing shim source: %w", err)
	}
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	out := filepath.Join(outDir, ShimName)
	cmd := exec.CommandContext(ctx, cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", out, src)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("compiling %s with %s: %w: %s", src, cc, err, msg)
	}
	klog.FromContext(ctx).V(4).Info("Built profiling shim", "path", out)
	return out, nil
}
