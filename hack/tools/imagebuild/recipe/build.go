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
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// Source is where the images say they come from.
const Source = "https://github.com/prismgpu/prism"

// Options say what to build and how to name it.
type Options struct {
	// RepoRoot is the checkout to build from.
	RepoRoot string
	// CacheDir keeps linked binaries, Debian packages and compressed
	// layers between builds, each under a key of its content or version.
	CacheDir string
	// NoCache relinks the Go binaries and recompresses every layer in a
	// temporary directory. Debian packages still come from the cache: they
	// are inputs, named by their exact version.
	NoCache bool
	// Platforms to build; every image holds them all.
	Platforms []v1.Platform
	// Simulation builds prism-kubelet-plugin as a test build
	// (SimulationTags): simulated GPUs from a fleet file, for test beds
	// and demos without GPUs, which the release build refuses. Such an
	// image is never a release's: Build refuses to name it under
	// DefaultRepository.
	Simulation bool
	// Repository is the registry path the release images are named
	// under: <Repository>/<image>:<Tag>; TestRepository the test images'.
	Repository     string
	TestRepository string
	Tag            string
	// Version and Revision go into the binaries (internal/version) and the
	// images' OCI labels.
	Version  string
	Revision string
	// Epoch stamps every file, the image configs and the binaries'
	// build time: the commit's time, so a rebuild is byte-identical.
	Epoch time.Time
	// Log receives progress lines; nil discards them.
	Log func(format string, args ...any)
}

// DefaultRepository is where the chart looks for the images by default.
// The test images are never published: "localhost/" keeps them from
// looking like something a registry serves.
const (
	DefaultRepository     = "ghcr.io/prismgpu"
	DefaultTestRepository = "localhost/prism-test"
)

// DefaultOptions derives the options from the checkout: version from the
// chart's appVersion, revision and epoch from git HEAD (SOURCE_DATE_EPOCH
// wins), the host's platform, the cache under PRISM_CACHE or ~/.cache/prism.
func DefaultOptions(repoRoot string) (Options, error) {
	o := Options{RepoRoot: repoRoot, Repository: DefaultRepository, TestRepository: DefaultTestRepository}
	chart, err := os.ReadFile(filepath.Join(repoRoot, "deployments/helm/prism/Chart.yaml"))
	if err != nil {
		return o, fmt.Errorf("reading the chart's appVersion: %w", err)
	}
	m := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?\s*$`).FindSubmatch(chart)
	if m == nil {
		return o, fmt.Errorf("no appVersion in deployments/helm/prism/Chart.yaml")
	}
	o.Version, o.Tag = string(m[1]), string(m[1])

	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-C", repoRoot}, args...)...).Output()
		return strings.TrimSpace(string(out)), err
	}
	if o.Revision, err = git("rev-parse", "HEAD"); err != nil {
		return o, fmt.Errorf("reading the git revision (build from a git checkout): %w", err)
	}
	if st, err := git("status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
		o.Revision += "-dirty"
	}
	epoch := os.Getenv("SOURCE_DATE_EPOCH")
	if epoch == "" {
		if epoch, err = git("log", "-1", "--format=%ct"); err != nil {
			return o, fmt.Errorf("reading the commit time: %w", err)
		}
	}
	sec, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil {
		return o, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", epoch, err)
	}
	o.Epoch = time.Unix(sec, 0).UTC()

	o.Platforms = []v1.Platform{{OS: "linux", Architecture: runtime.GOARCH}}
	cache := os.Getenv("PRISM_CACHE")
	if cache == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			return o, err
		}
		cache = filepath.Join(base, "prism")
	}
	o.CacheDir = filepath.Join(cache, "images")
	return o, nil
}

// Ref is the full reference of an image.
func (o Options) Ref(name string) string {
	repo := o.Repository
	for _, t := range TestImages {
		if name == t {
			repo = o.TestRepository
		}
	}
	return fmt.Sprintf("%s/%s:%s", strings.TrimSuffix(repo, "/"), name, o.Tag)
}

// Result is one image written.
type Result struct {
	Name string
	Ref  string
	Path string
	// Digest is what a registry will call the image after a push that
	// keeps the archive's manifests (skopeo copy, crane push).
	Digest    string
	Manifests map[string]string
	Size      int64
}

// Build writes each named image to the archive path out(name) returns.
func Build(ctx context.Context, o Options, names []string, out func(name string) string) ([]Result, error) {
	for _, n := range names {
		if _, ok := images[n]; !ok {
			return nil, fmt.Errorf("unknown image %q; known: %s", n, strings.Join(Names(), ", "))
		}
	}
	if len(o.Platforms) == 0 {
		return nil, fmt.Errorf("no platform to build")
	}
	if o.Simulation && strings.TrimSuffix(o.Repository, "/") == DefaultRepository {
		return nil, fmt.Errorf("a simulation build of prism-kubelet-plugin must not be named like a release image (%s): choose another repository", DefaultRepository)
	}
	if err := os.MkdirAll(o.CacheDir, 0o755); err != nil {
		return nil, err
	}
	// Builds from several processes (make images, a test, the e2e set-up)
	// share the cache; one at a time keeps half-written entries unseen.
	lock, err := os.OpenFile(filepath.Join(o.CacheDir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return nil, fmt.Errorf("locking the image cache: %w", err)
	}
	b := &builder{o: o, log: o.Log, debs: map[string]deb{}}
	if b.log == nil {
		b.log = func(string, ...any) {}
	}
	if o.NoCache {
		if b.scratch, err = os.MkdirTemp("", "imagebuild-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(b.scratch)
	}
	var results []Result
	for _, n := range names {
		r, err := b.image(ctx, n, out(n))
		if err != nil {
			return nil, fmt.Errorf("building image %s: %w", n, err)
		}
		results = append(results, r)
	}
	return results, nil
}

type builder struct {
	o   Options
	log func(format string, args ...any)
	// scratch replaces the cache's binary and layer directories with
	// NoCache.
	scratch string
	debs    map[string]deb
	// aptUpdated says apt-get update has run in this build.
	aptUpdated bool
	// labels and packages collect what an image's layers are made of
	// (tool and package versions) while they are gathered.
	labels   map[string]string
	packages map[string]bool
}

func (b *builder) dir(kind string) (string, error) {
	d := filepath.Join(b.o.CacheDir, kind)
	if b.scratch != "" && kind != "debs" {
		d = filepath.Join(b.scratch, kind)
	}
	return d, os.MkdirAll(d, 0o755)
}

func (b *builder) image(ctx context.Context, name, outPath string) (Result, error) {
	spec := images[name]
	b.labels, b.packages = map[string]string{}, map[string]bool{}
	layers := make([][]mutate.Addendum, len(b.o.Platforms))
	for i, p := range b.o.Platforms {
		for _, ls := range spec.layers(b, p) {
			l, err := b.layer(ctx, ls)
			if err != nil {
				return Result{}, fmt.Errorf("%s layer %q: %w", p, ls.createdBy, err)
			}
			layers[i] = append(layers[i], mutate.Addendum{Layer: l, History: v1.History{Created: v1.Time{Time: b.o.Epoch}, CreatedBy: ls.createdBy}})
		}
	}
	// The labels are complete only now: gathering the layers' entries
	// records the tool and package versions they hold.
	labels := map[string]string{
		"org.opencontainers.image.source":      Source,
		"org.opencontainers.image.version":     b.o.Version,
		"org.opencontainers.image.revision":    b.o.Revision,
		"org.opencontainers.image.created":     b.o.Epoch.Format(time.RFC3339),
		"org.opencontainers.image.title":       name,
		"org.opencontainers.image.description": spec.description,
		"org.opencontainers.image.licenses":    "Apache-2.0",
	}
	for k, v := range b.labels {
		labels[k] = v
	}
	if len(b.packages) > 0 {
		var pkgs []string
		for p := range b.packages {
			pkgs = append(pkgs, p)
		}
		sort.Strings(pkgs)
		labels["dev.prism.debian.packages"] = strings.Join(pkgs, " ")
	}
	annotations := map[string]string{}
	for _, k := range []string{"source", "version", "revision", "created"} {
		k = "org.opencontainers.image." + k
		annotations[k] = labels[k]
	}
	cfg := spec.config
	cfg.Labels = labels

	manifests := map[string]string{}
	var imgs []v1.Image
	for i, p := range b.o.Platforms {
		img, err := newImage(p, cfg, b.o.Epoch, layers[i], annotations)
		if err != nil {
			return Result{}, fmt.Errorf("%s: %w", p, err)
		}
		d, err := img.Digest()
		if err != nil {
			return Result{}, err
		}
		manifests[p.String()] = d.String()
		imgs = append(imgs, img)
	}
	top := topLevel(imgs, b.o.Platforms, annotations)
	digest, err := top.Digest()
	if err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(filepath.Dir(outPath), 0o755); err != nil {
		return Result{}, err
	}
	ref := b.o.Ref(name)
	if err := writeArchive(outPath, ref, top, b.o.Epoch); err != nil {
		return Result{}, err
	}
	st, err := os.Stat(outPath)
	if err != nil {
		return Result{}, err
	}
	b.log("%s: %s %s", name, ref, digest)
	return Result{Name: name, Ref: ref, Path: outPath, Digest: digest.String(), Manifests: manifests, Size: st.Size()}, nil
}

// layer gathers a layer's entries, and compresses it unless the cache holds
// a layer with the same content (diff ID).
func (b *builder) layer(ctx context.Context, ls layerSpec) (v1.Layer, error) {
	entries, err := ls.entries(ctx)
	if err != nil {
		return nil, err
	}
	raw, diffID, err := layerTar(entries, b.o.Epoch)
	if err != nil {
		return nil, err
	}
	dir, err := b.dir("layers")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, diffID.Hex+".tar.gz")
	if _, err := os.Stat(path); err != nil {
		if err := compressLayer(raw, path); err != nil {
			return nil, fmt.Errorf("compressing layer %s: %w", diffID, err)
		}
	}
	return openLayer(path)
}

type cgoMode int

const (
	cgoOff cgoMode = iota
	cgoDynamic
	cgoStatic
)

// goBinary is a Go program an image carries.
type goBinary struct {
	name string
	pkg  string
	// module is the directory of the Go module to build pkg in, relative
	// to the repository; empty for the main module.
	module string
	// version returns the -X flags that stamp the binary's version;
	// nil means Prism's (internal/version).
	version func(b *builder, moduleDir string) ([]string, error)
	dest    string
	cgo     cgoMode
	// tags are the build tags, comma-separated; the image records them
	// in the label dev.prism.build-tags.
	tags string
}

// goLayer builds a binary for the platform with -trimpath, no VCS stamp
// and the version linked in, so the same source gives the same bytes. In
// the cache, `go build -o` leaves an up-to-date binary alone.
func (b *builder) goLayer(p v1.Platform, g goBinary) layerSpec {
	return layerSpec{
		createdBy: "prism: go build " + g.pkg + " -> /" + g.dest,
		entries: func(ctx context.Context) ([]entry, error) {
			platform := p.OS + "-" + p.Architecture + p.Variant
			if g.tags != "" {
				// Apart from the untagged build's, which would otherwise
				// be relinked at every switch between the two.
				platform += "-" + strings.ReplaceAll(g.tags, ",", "-")
				b.labels["dev.prism.build-tags"] = g.tags
			}
			dir, err := b.dir(filepath.Join("bin", platform))
			if err != nil {
				return nil, err
			}
			out := filepath.Join(dir, g.name)
			if err := b.goBuild(ctx, p, g, out); err != nil {
				return nil, err
			}
			data, err := os.ReadFile(out)
			if err != nil {
				return nil, err
			}
			return []entry{{path: g.dest, kind: kindFile, mode: 0o755, data: data}}, nil
		},
	}
}

func (b *builder) goBuild(ctx context.Context, p v1.Platform, g goBinary, out string) error {
	moduleDir := filepath.Join(b.o.RepoRoot, g.module)
	stamp := g.version
	if stamp == nil {
		stamp = prismVersion
	}
	x, err := stamp(b, moduleDir)
	if err != nil {
		return err
	}
	ldflags := append([]string{"-s", "-w"}, x...)
	args := []string{"build", "-trimpath", "-buildvcs=false"}
	var tags []string
	if g.tags != "" {
		tags = strings.Split(g.tags, ",")
	}
	env := append(os.Environ(), "GOOS="+p.OS, "GOARCH="+p.Architecture, "GOFLAGS=-mod=readonly")
	if p.Architecture == "arm" && p.Variant != "" {
		env = append(env, "GOARM="+strings.TrimPrefix(p.Variant, "v"))
	}
	switch g.cgo {
	case cgoOff:
		env = append(env, "CGO_ENABLED=0")
	case cgoDynamic, cgoStatic:
		env = append(env, "CGO_ENABLED=1")
		if p.Architecture != runtime.GOARCH {
			cc, err := crossCC(p)
			if err != nil {
				return fmt.Errorf("%s needs cgo: %w", g.name, err)
			}
			env = append(env, "CC="+cc)
		}
		if g.cgo == cgoStatic {
			tags = append(tags, "netgo", "osusergo")
			ldflags = append(ldflags, "-linkmode=external", "-extldflags=-static")
		}
	}
	if len(tags) > 0 {
		args = append(args, "-tags="+strings.Join(tags, ","))
	}
	args = append(args, "-ldflags="+strings.Join(ldflags, " "), "-o", out, g.pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir, cmd.Env = moduleDir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, lastLines(stderr.String(), 30))
	}
	b.log("%s (%s): go build %s", g.name, p, time.Since(start).Round(100*time.Millisecond))
	return nil
}

func prismVersion(b *builder, _ string) ([]string, error) {
	const v = "github.com/prismgpu/prism/internal/version."
	return []string{
		"-X", v + "version=" + b.o.Version,
		"-X", v + "revision=" + b.o.Revision,
		"-X", v + "buildTime=" + b.o.Epoch.Format(time.RFC3339),
	}, nil
}

// toolkitVersion stamps nvidia-cdi-hook with the toolkit release its
// module pins, and records it as a label.
func toolkitVersion(b *builder, moduleDir string) ([]string, error) {
	const module = "github.com/NVIDIA/nvidia-container-toolkit"
	ver, err := RequiredVersion(filepath.Join(moduleDir, "go.mod"), module)
	if err != nil {
		return nil, err
	}
	b.labels["dev.prism.nvidia-cdi-hook.version"] = ver
	return []string{"-X", module + "/internal/info.version=" + ver}, nil
}

// crossCC names the Debian cross compiler for a cgo build on another CPU.
func crossCC(p v1.Platform) (string, error) {
	triplets := map[string]string{"arm64": "aarch64-linux-gnu", "amd64": "x86_64-linux-gnu"}
	t, ok := triplets[p.Architecture]
	if !ok {
		return "", fmt.Errorf("no cross compiler known for %s", p)
	}
	cc := t + "-gcc"
	if _, err := exec.LookPath(cc); err != nil {
		return "", fmt.Errorf("cross compiler %s not found; install it with: apt-get install gcc-%s", cc, t)
	}
	return cc, nil
}

// RequiredVersion reads a module's version from a go.mod's require lines.
func RequiredVersion(goMod, module string) (string, error) {
	b, err := os.ReadFile(goMod)
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(b)
	if m == nil {
		return "", fmt.Errorf("%s does not require %s", goMod, module)
	}
	return string(m[1]), nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
