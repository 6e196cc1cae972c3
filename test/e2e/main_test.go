package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// pluginBinary is prism-kubelet-plugin built once for the whole package, with
// the fault-injection hooks compiled in; controllerBinary and prismctlBinary
// are the other two binaries as shipped.
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
		{pluginBinary, "github.com/prismgpu/prism/cmd/prism-kubelet-plugin", "faultinject"},
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
	return m.Run()
}
