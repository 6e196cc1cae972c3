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

// Package deps checks that the binaries Prism ships link no test code.
package deps

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const module = "github.com/prismgpu/prism"

// binaries are the commands that run in the cluster. prismctl is left out:
// its simulate command is internal/sim.
var binaries = []string{"./cmd/prism-kubelet-plugin", "./cmd/prism-controller"}

var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

// notShipped says whether a package is test or build code that a shipped
// binary must not link: the standard library's testing and testing/...,
// Prism's test/ and hack/ trees, its simulator internal/sim, its helpers for
// tests, the packages named *test such as internal/plugin/profiling/profilingtest, and
// the image builder's go-containerregistry.
func notShipped(pkg string) bool {
	if pkg == "testing" || strings.HasPrefix(pkg, "testing/") || strings.HasPrefix(pkg, "github.com/google/go-containerregistry/") {
		return true
	}
	rel, ok := strings.CutPrefix(pkg, module+"/")
	if !ok {
		return false
	}
	return rel == "test" || strings.HasPrefix(rel, "test/") ||
		strings.HasPrefix(rel, "hack/") ||
		rel == "internal/sim" || strings.HasPrefix(rel, "internal/sim/") ||
		strings.HasSuffix(rel, "test")
}

func TestBinariesLinkNoTestCode(t *testing.T) {
	for _, bin := range binaries {
		t.Run(filepath.Base(bin), func(t *testing.T) {
			root, imports := importGraph(t, bin)
			for _, chain := range chainsTo(root, imports, notShipped) {
				t.Errorf("%s links %s: %s", filepath.Base(bin), chain[len(chain)-1], strings.Join(chain, " -> "))
			}
		})
	}
}

// testBuild is what only a test build of prism-kubelet-plugin holds: the
// flags of simulated GPUs, go-nvml's mock that serves them, and the crash
// points of the fault-injection tests.
type testBuild struct {
	Flags       []string
	NVMLMock    bool
	CrashPoints bool
}

// testBuildFlag is a flag of a test build as --help lists it.
var testBuildFlag = regexp.MustCompile(`(?m)^\s+(--fleet|--simulated-faults)\s`)

// TestReleasePluginHasNoTestBuild: the plugin as `make build` and the
// release images build it, without tags, has none of a test build's parts;
// the test build (-tags simulation,faultinject) has them all, so that the
// check is seen to find them. pkg/gpu/nvml holds its simulation beside
// NVML, so go list -deps names the mock either way; the linker drops what
// nothing calls, and the symbols say what is left. Symbols need an
// unstripped build; stripping drops only them.
func TestReleasePluginHasNoTestBuild(t *testing.T) {
	for _, tc := range []struct {
		tags string
		want testBuild
	}{
		{tags: "", want: testBuild{}},
		{tags: "simulation,faultinject", want: testBuild{Flags: []string{"--fleet", "--simulated-faults"}, NVMLMock: true, CrashPoints: true}},
	} {
		t.Run("tags="+tc.tags, func(t *testing.T) {
			bin := filepath.Join(t.TempDir(), "prism-kubelet-plugin")
			build := exec.Command("go", "build", "-trimpath", "-tags", tc.tags, "-o", bin, "./cmd/prism-kubelet-plugin")
			build.Dir = repoRoot
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build -tags %q: %v\n%s", tc.tags, err, out)
			}
			help, err := exec.Command(bin, "--help").CombinedOutput()
			if err != nil {
				t.Fatalf("--help: %v\n%s", err, help)
			}
			symbols, err := exec.Command("go", "tool", "nm", bin).Output()
			if err != nil {
				t.Fatalf("go tool nm: %v", err)
			}
			data, err := os.ReadFile(bin)
			if err != nil {
				t.Fatal(err)
			}
			got := testBuild{
				NVMLMock: bytes.Contains(symbols, []byte(" github.com/NVIDIA/go-nvml/pkg/nvml/mock.")),
				// The variable that names the crash point to die at.
				CrashPoints: bytes.Contains(data, []byte("PRISM_CRASH_AT")),
			}
			for _, m := range testBuildFlag.FindAllSubmatch(help, -1) {
				got.Flags = append(got.Flags, string(m[1]))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("prism-kubelet-plugin built with tags %q (-want +got):\n%s", tc.tags, diff)
			}
		})
	}
}

// importGraph lists the packages that a linux build of the command at dir
// links, each with its imports, as `go list -deps` sees them.
func importGraph(t *testing.T, dir string) (root string, imports map[string][]string) {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", dir)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "GOOS=linux")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", dir, err, stderr.String())
	}
	imports = map[string][]string{}
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		// -deps lists a package after everything it imports, so the command
		// comes last.
		root = fields[0]
		imports[root] = fields[1:]
	}
	return root, imports
}

// chainsTo returns, for each package that matches, the shortest import
// chain from root to it.
func chainsTo(root string, imports map[string][]string, match func(string) bool) [][]string {
	parent := map[string]string{root: ""}
	queue := []string{root}
	var chains [][]string
	for len(queue) > 0 {
		pkg := queue[0]
		queue = queue[1:]
		if match(pkg) {
			var chain []string
			for p := pkg; p != ""; p = parent[p] {
				chain = append([]string{strings.TrimPrefix(p, module+"/")}, chain...)
			}
			chains = append(chains, chain)
		}
		for _, imp := range imports[pkg] {
			if _, seen := parent[imp]; !seen {
				parent[imp] = pkg
				queue = append(queue, imp)
			}
		}
	}
	return chains
}
