package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// pluginBinary is prism-kubelet-plugin built once for the whole package, with
// the fault-injection hooks compiled in.
var pluginBinary string

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
	build := exec.Command("go", "build", "-tags", "faultinject", "-o", pluginBinary, "github.com/prismgpu/prism/cmd/prism-kubelet-plugin")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "build prism-kubelet-plugin: %v\n", err)
		return 1
	}
	return m.Run()
}
