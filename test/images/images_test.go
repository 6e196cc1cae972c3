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

// Package images checks Prism's container images as `make images` builds
// them (hack/tools/imagebuild): what each runs, as whom, with which labels,
// what it holds and lacks, that its entrypoint runs inside its own root
// filesystem, and that a rebuild is byte-identical.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
)

var repoRoot = func() string {
	root, err := filepath.Abs("../..")
	if err != nil {
		panic(err)
	}
	return root
}()

var (
	buildOnce sync.Once
	built     map[string]*recipe.Archive
	buildOpts recipe.Options
	buildErr  error
	outDir    string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if outDir != "" {
		os.RemoveAll(outDir)
	}
	os.Exit(code)
}

// images builds every image once per test binary, through the builder's
// cache as `make images` does, and reads the archives back.
func images(t *testing.T) (recipe.Options, map[string]*recipe.Archive) {
	t.Helper()
	buildOnce.Do(func() {
		if buildOpts, buildErr = recipe.DefaultOptions(repoRoot); buildErr != nil {
			return
		}
		if outDir, buildErr = os.MkdirTemp("", "prism-images-"); buildErr != nil {
			return
		}
		buildOpts.Log = func(format string, args ...any) { t.Logf(format, args...) }
		names := append(slices.Clone(recipe.ReleaseImages), recipe.TestImages...)
		results, err := recipe.Build(context.Background(), buildOpts, names, func(n string) string { return filepath.Join(outDir, n+".tar") })
		buildOpts.Log = nil
		if err != nil {
			buildErr = err
			return
		}
		built = map[string]*recipe.Archive{}
		for _, r := range results {
			a, err := recipe.ReadArchive(r.Path, filepath.Join(outDir, "read", r.Name))
			if err != nil {
				buildErr = err
				return
			}
			if a.Digest != r.Digest {
				buildErr = errors.New(r.Name + ": archive's digest differs from the one the build reported")
				return
			}
			built[r.Name] = a
		}
	})
	if buildErr != nil {
		t.Fatalf("building the images: %v", buildErr)
	}
	return buildOpts, built
}

// image is one image of the host's platform.
func image(t *testing.T, name string) recipe.ArchiveImage {
	t.Helper()
	_, archives := images(t)
	a, ok := archives[name]
	if !ok {
		t.Fatalf("image %s not built", name)
	}
	img, err := a.Image(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func TestImagesAreNamedAndLabelled(t *testing.T) {
	o, archives := images(t)
	for _, tc := range []struct {
		name, ref, user string
		entrypoint      []string
	}{
		{"prism-kubelet-plugin", "ghcr.io/prismgpu/prism-kubelet-plugin:" + o.Version, "0:0", []string{"/usr/bin/prism-kubelet-plugin"}},
		{"prism-controller", "ghcr.io/prismgpu/prism-controller:" + o.Version, "65532:65532", []string{"/usr/bin/prism-controller"}},
		{"pause", "localhost/prism-test/pause:" + o.Version, "65535:65535", []string{"/pause"}},
		{"workload", "localhost/prism-test/workload:" + o.Version, "0:0", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := archives[tc.name].Ref; got != tc.ref {
				t.Errorf("named %q, want %q", got, tc.ref)
			}
			cfg := image(t, tc.name).Config
			if cfg.User != tc.user {
				t.Errorf("user %q, want %q", cfg.User, tc.user)
			}
			if !slices.Equal(cfg.Entrypoint, tc.entrypoint) {
				t.Errorf("entrypoint %q, want %q", cfg.Entrypoint, tc.entrypoint)
			}
			for k, want := range map[string]string{
				"org.opencontainers.image.source":   recipe.Source,
				"org.opencontainers.image.version":  o.Version,
				"org.opencontainers.image.revision": o.Revision,
				"org.opencontainers.image.title":    tc.name,
			} {
				if got := cfg.Labels[k]; got != want || got == "" {
					t.Errorf("label %s=%q, want %q", k, got, want)
				}
			}
		})
	}
}

// The static, non-root images and their one binary.
var staticImages = []struct{ image, binary string }{
	{"prism-controller", "usr/bin/prism-controller"},
}

// The chart runs the controller with runAsNonRoot, which the kubelet can
// only check against a numeric user.
func TestStaticImagesRunAsNumericNonRootUser(t *testing.T) {
	for _, tc := range staticImages {
		user := image(t, tc.image).Config.User
		uid, _, _ := strings.Cut(user, ":")
		if uid == "" || uid == "0" || strings.Trim(uid, "0123456789") != "" {
			t.Errorf("%s user %q, want a numeric non-zero uid", tc.image, user)
		}
	}
}

func TestStaticImagesHaveNoShell(t *testing.T) {
	for _, tc := range staticImages {
		t.Run(tc.image, func(t *testing.T) {
			for p, h := range files(t, tc.image) {
				base := path.Base(p)
				if base == "sh" || base == "bash" || base == "ash" || base == "dash" || strings.Contains(base, "busybox") {
					t.Errorf("image has %s", p)
				}
				if h.Typeflag == tar.TypeReg && h.Mode&0o111 != 0 && p != tc.binary {
					t.Errorf("image has executable %s besides its own binary", p)
				}
			}
			if interp := interpreter(t, read(t, tc.image, tc.binary)); interp != "" {
				t.Errorf("%s is dynamically linked (%s), want static", tc.binary, interp)
			}
		})
	}
}

// The plugin dlopens NVML through cgo, so it needs the loader and every
// library it links, and the hook it hands the host must run there without
// the image's glibc.
func TestPluginImageHoldsGlibcAndTheHook(t *testing.T) {
	files := files(t, "prism-kubelet-plugin")
	bin := read(t, "prism-kubelet-plugin", "usr/bin/prism-kubelet-plugin")
	interp := interpreter(t, bin)
	if interp == "" {
		t.Fatalf("prism-kubelet-plugin is static; NVML needs cgo and glibc")
	}
	if _, ok := resolve(files, interp); !ok {
		t.Errorf("the plugin's loader %s is not in the image", interp)
	}
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	if len(libs) == 0 {
		t.Fatalf("prism-kubelet-plugin links no library")
	}
	for _, lib := range libs {
		found := false
		for _, dir := range []string{"lib", "usr/lib", "lib64", "usr/lib64"} {
			for _, sub := range []string{"", libTriplet()} {
				if _, ok := resolve(files, path.Join("/", dir, sub, lib)); ok {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("the plugin links %s, which the image lacks", lib)
		}
	}
	hook := read(t, "prism-kubelet-plugin", "usr/bin/nvidia-cdi-hook")
	if interp := interpreter(t, hook); interp != "" {
		t.Errorf("nvidia-cdi-hook is dynamically linked (%s); it runs on the host, whose glibc is unknown", interp)
	}
	shim, err := elf.NewFile(bytes.NewReader(read(t, "prism-kubelet-plugin", recipe.ProfilingShimPath)))
	if err != nil {
		t.Fatalf("profiling shim: %v", err)
	}
	if shim.Type != elf.ET_DYN || shim.Machine != f.Machine {
		t.Errorf("profiling shim is %v for %v, want a shared object for %v", shim.Type, shim.Machine, f.Machine)
	}
	for _, p := range []string{"bin/sh", "bin/busybox"} {
		if _, ok := resolve(files, "/"+p); !ok {
			t.Errorf("plugin image lacks /%s, which the init containers run", p)
		}
	}
}

// The hook in the image must be the toolkit release that nvcdi writes specs
// for: its subcommands and flags are named in those specs.
func TestCDIHookVersionMatchesNvcdi(t *testing.T) {
	const module = "github.com/NVIDIA/nvidia-container-toolkit"
	main, err := recipe.RequiredVersion(filepath.Join(repoRoot, "go.mod"), module)
	if err != nil {
		t.Fatal(err)
	}
	hook, err := recipe.RequiredVersion(filepath.Join(repoRoot, "hack/tools/imagebuild/nvidia-cdi-hook/go.mod"), module)
	if err != nil {
		t.Fatal(err)
	}
	if hook != main {
		t.Errorf("nvidia-cdi-hook is built from %s %s, nvcdi comes from %s", module, hook, main)
	}
	if got := image(t, "prism-kubelet-plugin").Config.Labels["dev.prism.nvidia-cdi-hook.version"]; got != main {
		t.Errorf("plugin image says nvidia-cdi-hook %q, want %q", got, main)
	}
}

func libTriplet() string {
	return map[string]string{"amd64": "x86_64-linux-gnu", "arm64": "aarch64-linux-gnu"}[runtime.GOARCH]
}

// files lists the image's files as the runtime sees them, upper layers
// over lower ones, by path relative to the root.
func files(t *testing.T, name string) map[string]*tar.Header {
	t.Helper()
	fs := map[string]*tar.Header{}
	err := walk(image(t, name), func(h *tar.Header, _ io.Reader) error {
		fs[strings.TrimSuffix(path.Clean(h.Name), "/")] = h
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return fs
}

// walk calls fn for every entry of the image's flattened filesystem (what a
// runtime unpacks: each path once, from the topmost layer that has it),
// with the entry's content.
func walk(img v1.Image, fn func(*tar.Header, io.Reader) error) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	return recipe.EachTarEntry(rc, fn)
}

// resolve follows symlinks inside the image to a regular file.
func resolve(files map[string]*tar.Header, p string) (string, bool) {
	for range 16 {
		rel := strings.TrimPrefix(path.Clean(p), "/")
		h, ok := files[rel]
		if !ok {
			// A symlinked parent directory (lib64 -> lib) hides the file.
			for dir := path.Dir(rel); dir != "."; dir = path.Dir(dir) {
				if d, ok := files[dir]; ok && d.Typeflag == tar.TypeSymlink {
					target := d.Linkname
					if !path.IsAbs(target) {
						target = path.Join("/", path.Dir(dir), target)
					}
					return resolve(files, path.Join(target, strings.TrimPrefix(rel, dir+"/")))
				}
			}
			return "", false
		}
		if h.Typeflag != tar.TypeSymlink {
			return rel, h.Typeflag == tar.TypeReg
		}
		if path.IsAbs(h.Linkname) {
			p = h.Linkname
		} else {
			p = path.Join("/", path.Dir(rel), h.Linkname)
		}
	}
	return "", false
}

// read returns a file's content from the image.
func read(t *testing.T, name, p string) []byte {
	t.Helper()
	return readFrom(t, name, image(t, name), p)
}

// readFrom returns a file's content from img, which is called name.
func readFrom(t *testing.T, name string, img v1.Image, p string) []byte {
	t.Helper()
	var data []byte
	err := walk(img, func(h *tar.Header, r io.Reader) error {
		if strings.TrimSuffix(h.Name, "/") == p {
			b, err := io.ReadAll(r)
			data = b
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if data == nil {
		t.Fatalf("image %s has no %s", name, p)
	}
	return data
}

// interpreter is an ELF executable's PT_INTERP, empty for a static one.
func interpreter(t *testing.T, bin []byte) string {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(bin))
	if err != nil {
		t.Fatalf("not an ELF executable: %v", err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				t.Fatal(err)
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}
