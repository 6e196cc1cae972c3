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

// Package recipe says what is in each of Prism's images and builds them
// into OCI archives with package oci: Go binaries from this repository,
// nvidia-cdi-hook from the Go module proxy, glibc and busybox from Debian
// packages (apt-get download), nothing from an image registry. The
// Dockerfiles under images/ build the same contents with Docker or Buildah.
package recipe

import (
	"context"
	"fmt"
	"io/fs"
	"sort"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Images built by `make images`; the test images only on request.
var (
	ReleaseImages = []string{"prism-kubelet-plugin", "prism-controller"}
	TestImages    = []string{"pause", "workload"}
)

// Users of the images: root for the plugin, which writes root-owned host
// directories; the distroless convention 65532 for the controller; the
// pause container's customary 65535.
const (
	ControllerUID = 65532
	PauseUID      = 65535
)

// layerSpec is one layer: what it holds and how to gather its entries.
type layerSpec struct {
	createdBy string
	entries   func(ctx context.Context) ([]entry, error)
}

type image struct {
	description string
	config      v1.Config
	layers      func(b *builder, p v1.Platform) []layerSpec
}

// BusyboxApplets are linked to /bin/busybox: what the chart's init
// containers and the test workloads run.
var BusyboxApplets = []string{
	"[", "basename", "cat", "chmod", "cp", "cut", "date", "dirname", "du", "echo", "env",
	"false", "find", "grep", "head", "hostname", "id", "ln", "ls", "mkdir", "mount",
	"mv", "printenv", "ps", "pwd", "readlink", "rm", "rmdir", "sed", "sh", "sleep",
	"sort", "stat", "tail", "tee", "test", "touch", "tr", "true", "uname", "wc", "which",
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

var images = map[string]image{
	"prism-kubelet-plugin": {
		description: "Prism DRA kubelet plugin for NVIDIA GPUs, with glibc for NVML and nvidia-cdi-hook for the host",
		config: v1.Config{
			User:       "0:0",
			Env:        []string{defaultPath},
			Entrypoint: []string{"/usr/bin/prism-kubelet-plugin"},
		},
		layers: func(b *builder, p v1.Platform) []layerSpec {
			return []layerSpec{
				b.baseFiles(),
				b.debLayer(p, "glibc", glibcKeep, "libc6", "libgcc-s1"),
				b.busybox(p),
				b.goLayer(p, nvidiaCDIHook),
				b.profilingShim(p),
				b.goLayer(p, b.kubeletPlugin()),
			}
		},
	},
	"prism-controller": {
		description: "Prism admission controller (ResourceClaim rewrites, WorkloadProfiles); static, non-root, no shell",
		config: v1.Config{
			User:       fmt.Sprintf("%d:%d", ControllerUID, ControllerUID),
			Env:        []string{defaultPath},
			Entrypoint: []string{"/usr/bin/prism-controller"},
		},
		layers: func(b *builder, p v1.Platform) []layerSpec {
			return []layerSpec{b.baseFiles(), b.goLayer(p, controller)}
		},
	},
	"pause": {
		description: "Prism test bed: pod sandbox (pause) container",
		config: v1.Config{
			User:       fmt.Sprintf("%d:%d", PauseUID, PauseUID),
			Entrypoint: []string{"/pause"},
		},
		layers: func(b *builder, p v1.Platform) []layerSpec {
			return []layerSpec{b.goLayer(p, pause)}
		},
	},
	"workload": {
		// A static busybox for the tools, and glibc with Debian's dynamically
		// linked dash, because a profiled workload's first process must be
		// dynamically linked for the loader to read the preload list that
		// starts ncu (docs/profiling.md).
		description: "Prism test bed: workload with Debian's busybox-static (sh, env, ls, cat, sleep, ...), glibc and dash (dynamically linked)",
		config: v1.Config{
			User: "0:0",
			Env:  []string{defaultPath},
			Cmd:  []string{"/bin/sh"},
		},
		layers: func(b *builder, p v1.Platform) []layerSpec {
			return []layerSpec{
				b.baseFiles(),
				b.busybox(p),
				b.debLayer(p, "glibc", glibcKeep, "libc6"),
				b.debLayer(p, "dash", func(path string) bool { return path == "bin/dash" }, "dash"),
			}
		},
	},
}

// Config is an image's runtime config, without the labels a build adds.
func Config(name string) (v1.Config, bool) {
	img, ok := images[name]
	return img.config, ok
}

// Names lists every image the builder knows.
func Names() []string {
	var names []string
	for n := range images {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Go binaries. The plugin links glibc dynamically (go-nvml dlopens
// libnvidia-ml.so.1 through cgo); nvidia-cdi-hook also needs cgo but runs
// on the host, whose glibc is unknown, so it is linked statically.
var (
	kubeletPlugin = goBinary{name: "prism-kubelet-plugin", pkg: "./cmd/prism-kubelet-plugin", dest: "usr/bin/prism-kubelet-plugin", cgo: cgoDynamic}
	controller    = goBinary{name: "prism-controller", pkg: "./cmd/prism-controller", dest: "usr/bin/prism-controller", cgo: cgoOff}
	pause         = goBinary{name: "pause", pkg: "./images/pause", dest: "pause", cgo: cgoOff}
	nvidiaCDIHook = goBinary{
		name:    "nvidia-cdi-hook",
		pkg:     "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook",
		module:  "hack/tools/imagebuild/nvidia-cdi-hook",
		version: toolkitVersion,
		dest:    "usr/bin/nvidia-cdi-hook",
		cgo:     cgoStatic,
	}
)

// SimulationTags build the test build of prism-kubelet-plugin, which
// has --fleet and --simulated-faults (cmd/prism-kubelet-plugin/simulation.go).
const SimulationTags = "simulation"

// kubeletPlugin is the plugin binary this build wants: the release build,
// or with Options.Simulation the test build.
func (b *builder) kubeletPlugin() goBinary {
	g := kubeletPlugin
	if b.o.Simulation {
		g.tags = SimulationTags
	}
	return g
}

// ProfilingShimPath is where the plugin image keeps the profiling preload
// shim; the chart's install-profiling-shim init container copies it to the
// host. Not the plugin's --profiling-shim default: that names a host path,
// and finding this image path there would hand the runtime a mount source
// the host lacks.
const ProfilingShimPath = "usr/libexec/prism/libprism-profile.so"

// baseFiles holds the users and groups the images run as, and /tmp.
func (b *builder) baseFiles() layerSpec {
	return layerSpec{
		createdBy: "prism: /etc/passwd, /etc/group, /tmp",
		entries: func(context.Context) ([]entry, error) {
			passwd := fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n", ControllerUID, ControllerUID)
			group := fmt.Sprintf("root:x:0:\nnonroot:x:%d:\nnogroup:x:65534:\n", ControllerUID)
			return []entry{
				{path: "etc/passwd", kind: kindFile, mode: 0o644, data: []byte(passwd)},
				{path: "etc/group", kind: kindFile, mode: 0o644, data: []byte(group)},
				{path: "tmp", kind: kindDir, mode: 0o777 | fs.ModeSticky},
				{path: "home/nonroot", kind: kindDir, mode: 0o700, uid: ControllerUID, gid: ControllerUID},
			}, nil
		},
	}
}

// busybox is Debian's static busybox and its applet links.
func (b *builder) busybox(p v1.Platform) layerSpec {
	l := b.debLayer(p, "busybox", func(path string) bool { return path == "bin/busybox" }, "busybox-static")
	debEntries := l.entries
	l.entries = func(ctx context.Context) ([]entry, error) {
		entries, err := debEntries(ctx)
		if err != nil {
			return nil, err
		}
		for _, a := range BusyboxApplets {
			entries = append(entries, entry{path: "bin/" + a, kind: kindSymlink, target: "busybox", mode: 0o777})
		}
		return entries, nil
	}
	return l
}

// glibcKeep drops documentation and the iconv charset modules (gconv), which
// Go programs never load.
func glibcKeep(path string) bool {
	for _, prefix := range []string{"usr/share/doc", "usr/share/lintian", "usr/share/man", "usr/share/info"} {
		if path == prefix || hasDirPrefix(path, prefix) {
			return false
		}
	}
	return !containsDir(path, "gconv")
}
