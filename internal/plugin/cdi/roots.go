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

package cdi

import (
	"os"
	"path/filepath"
	"strings"
)

// Roots say where the NVIDIA driver's files are. A spec is read by the
// container runtime on the host, so it must name host paths; the plugin runs
// in a container that sees the host's files wherever the chart mounted them
// (host / at /driver-root by default), so it must look for them there.
type Roots struct {
	// DriverRoot is where the driver is installed on the host: "/" for a
	// host-installed driver, /run/nvidia/driver for the GPU operator's
	// driver container. Defaults to "/".
	DriverRoot string
	// ContainerDriverRoot is where this process sees DriverRoot. Defaults
	// to DriverRoot, as when the plugin runs in the host's mount namespace.
	ContainerDriverRoot string
	// DevRoot is the host directory holding the driver's dev/nvidia*
	// nodes, and ContainerDevRoot where this process sees it. When DevRoot
	// is empty both are probed: a driver container creates its nodes under
	// its own root, a host-installed driver under /.
	DevRoot          string
	ContainerDevRoot string
}

// resolve fills in defaults and probes the dev root.
func (r Roots) resolve() Roots {
	if r.DriverRoot == "" {
		r.DriverRoot = "/"
	}
	if r.ContainerDriverRoot == "" {
		r.ContainerDriverRoot = r.DriverRoot
	}
	switch {
	case r.DevRoot != "" && r.ContainerDevRoot == "":
		r.ContainerDevRoot = r.DevRoot
	case r.DevRoot == "":
		r.DevRoot, r.ContainerDevRoot = r.DriverRoot, r.ContainerDriverRoot
		if _, err := os.Stat(filepath.Join(r.ContainerDriverRoot, "dev", "nvidiactl")); err != nil {
			// The driver root has no device nodes of its own: they are the
			// host's, which this process sees where it sees host paths
			// outside the driver root.
			r.DevRoot, r.ContainerDevRoot = "/", r.containerHostRoot()
		}
	}
	return r
}

// containerHostRoot is where this process sees host "/", known only when
// the driver root is host "/" itself; otherwise the process is assumed to
// see host paths outside the driver root in place.
func (r Roots) containerHostRoot() string {
	if filepath.Clean(r.DriverRoot) == "/" {
		return r.ContainerDriverRoot
	}
	return "/"
}

// ContainerPath is where this process sees a host path that a spec names.
func (r Roots) ContainerPath(hostPath string) string {
	r = r.resolve()
	return move(hostPath, [2]string{devDir(r.DevRoot), devDir(r.ContainerDevRoot)}, [2]string{r.DriverRoot, r.ContainerDriverRoot})
}

// HostPath is the host path of a file this process sees at containerPath.
func (r Roots) HostPath(containerPath string) string {
	r = r.resolve()
	return move(containerPath, [2]string{devDir(r.ContainerDevRoot), devDir(r.DevRoot)}, [2]string{r.ContainerDriverRoot, r.DriverRoot})
}

// move maps p by the first pair whose first directory holds it: to the
// same place under the pair's second directory.
func move(p string, pairs ...[2]string) string {
	for _, m := range pairs {
		if rest, ok := under(p, m[0]); ok {
			return filepath.Join(m[1], rest)
		}
	}
	return p
}

func devDir(root string) string { return filepath.Join(root, "dev") }

// under reports whether p is root or inside it, and the rest of p.
func under(p, root string) (string, bool) {
	p, root = filepath.Clean(p), filepath.Clean(root)
	if root == "/" {
		return p, true
	}
	if p == root {
		return "/", true
	}
	rest, ok := strings.CutPrefix(p, root+"/")
	return "/" + rest, ok
}
