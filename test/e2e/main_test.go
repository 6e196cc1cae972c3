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

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/test/testbed"
)

// pluginBinary is prism-kubelet-plugin built once for the whole package, as
// a test build: simulated GPUs (bed.PluginBuildTags) and the fault-injection
// hooks compiled in; controllerBinary and prismctlBinary are the other two
// binaries as shipped.
var pluginBinary, controllerBinary, prismctlBinary string

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "prism-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	pluginBinary = filepath.Join(dir, "prism-kubelet-plugin")
	controllerBinary = filepath.Join(dir, "prism-controller")
	prismctlBinary = filepath.Join(dir, "prismctl")
	for _, b := range []struct{ out, pkg, tags string }{
		{pluginBinary, "github.com/prismgpu/prism/cmd/prism-kubelet-plugin", bed.PluginBuildTags + ",faultinject"},
		{controllerBinary, "github.com/prismgpu/prism/cmd/prism-controller", ""},
		{prismctlBinary, "github.com/prismgpu/prism/cmd/prismctl", ""},
	} {
		build := exec.Command("go", "build", "-tags", b.tags, "-o", b.out, b.pkg)
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n", b.pkg, err)
			return 1
		}
	}
	// Each test's cluster stops while the next test runs.
	wait := testbed.StopInBackground()
	defer wait()
	return m.Run()
}

// buildStandIn builds one of test/tools' stand-ins for an NVIDIA tool, under
// the name the plugin runs it by, into a directory of its own, and returns
// the binary's path.
func buildStandIn(t *testing.T, tool, name string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), name)
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/prismgpu/prism/test/tools/"+tool).CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in %s: %v\n%s", name, err, out)
	}
	return bin
}

// buildStandInNCU builds test/tools/fake-ncu as ncu and returns its
// directory, for --ncu-path.
func buildStandInNCU(t *testing.T) string {
	t.Helper()
	return filepath.Dir(buildStandIn(t, "fake-ncu", "ncu"))
}
