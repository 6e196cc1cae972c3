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

package nvml

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"
)

const libraryName = "libnvidia-ml.so.1"

// libraryDirs are where distributions and the GPU Operator's driver
// container put NVML, relative to the driver root.
var libraryDirs = []string{
	"usr/lib64",
	"usr/lib/x86_64-linux-gnu",
	"usr/lib/aarch64-linux-gnu",
	"lib64",
	"lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu",
	"usr/lib",
}

// ErrNoNVML means no usable NVML library was found. The error wrapping it
// says what to do about it.
var ErrNoNVML = errors.New("NVML not available")

// New loads NVML from the driver installed under driverRoot: "/" when the
// driver is installed on the host, or e.g. "/run/nvidia/driver" when a
// driver container provides it. The library is probed once here so that a
// node without a driver fails at start-up with advice, not later with an
// opaque NVML return code.
func New(ctx context.Context, driverRoot string) (nvml.Interface, error) {
	logger := klog.FromContext(ctx)
	path, searched := findLibrary(driverRoot)
	if path == "" {
		if alt := otherDriverRoot(driverRoot); alt != "" {
			return nil, fmt.Errorf("%w: %s not found under driver root %q (searched %s), but there is one under its %s: make that directory the driver root (for a driver root of /, --driver-root=/%s, or the chart's kubeletPlugin.driverRoot: /%s)",
				ErrNoNVML, libraryName, driverRoot, strings.Join(searched, ", "), alt, alt, alt)
		}
		return nil, fmt.Errorf("%w: %s not found under driver root %q (searched %s); install the NVIDIA driver on this node, or point the driver root at where it is installed",
			ErrNoNVML, libraryName, driverRoot, strings.Join(searched, ", "))
	}
	lib := nvml.New(nvml.WithLibraryPath(path))
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: initializing %s: %v; check that the NVIDIA kernel module is loaded and matches the library (nvidia-smi should work)",
			ErrNoNVML, path, ret)
	}
	if ret := lib.Shutdown(); ret != nvml.SUCCESS {
		logger.Error(ret, "Shutting down NVML after probing it")
	}
	logger.V(2).Info("Using NVML", "path", path)
	return lib, nil
}

// otherDriverRoots are where some installs keep the whole driver under a
// root of its own: GKE's installer and CUDA images use /usr/local/nvidia
// (lib64/libnvidia-ml.so.1), as did the H100 Prism was run on; the GPU
// Operator's driver container uses /run/nvidia/driver.
var otherDriverRoots = []string{"usr/local/nvidia", "run/nvidia/driver"}

// otherDriverRoot is a directory under driverRoot (one of
// otherDriverRoots) where NVML is installed after all, for the error that
// says where to point the driver root; "" if none. It is advice, not a
// fallback: the driver root also names the host paths of the CDI specs,
// which a guess here could get wrong.
func otherDriverRoot(driverRoot string) string {
	for _, alt := range otherDriverRoots {
		if p, _ := findLibrary(filepath.Join(driverRoot, alt)); p != "" {
			return alt
		}
	}
	return ""
}

func findLibrary(driverRoot string) (string, []string) {
	var searched []string
	for _, dir := range libraryDirs {
		p := filepath.Join(driverRoot, dir, libraryName)
		searched = append(searched, p)
		// A dangling symlink is as good as missing.
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, searched
		}
	}
	return "", searched
}
