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

// Command imagebuild builds Prism's container images into OCI archives
// with no daemon, no registry and no privileges (package recipe says what
// each image holds; images/ has the equivalent Dockerfiles):
//
//	go run ./hack/tools/imagebuild                       # release images into _output/images/
//	go run ./hack/tools/imagebuild --image=pause --out=_output/images/pause.tar
//	go run ./hack/tools/imagebuild --image=all --platforms=linux/amd64,linux/arm64
//
// Images: prism-kubelet-plugin and prism-controller (the default,
// --image=release), and the test bed's pause and workload (--image=test).
// Groups and names combine: --image=release,pause. --simulation builds the
// plugin as a test build, with simulated GPUs, under a repository of one's
// own:
//
//	go run ./hack/tools/imagebuild --simulation --repository=localhost/prism-sim
//
// Each archive names its image <repository>/<image>:<tag>, loads with
// `ctr -n k8s.io images import` and pushes with skopeo or crane. The same
// checkout gives the same digests; binaries, Debian packages and layers are
// cached under $PRISM_CACHE/images (~/.cache/prism/images).
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func run() error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	o, err := recipe.DefaultOptions(root)
	if err != nil {
		return err
	}
	var (
		which     = flag.String("image", "release", "comma-separated images or groups to build: release ("+strings.Join(recipe.ReleaseImages, ",")+"), test ("+strings.Join(recipe.TestImages, ",")+"), all")
		out       = flag.String("out", filepath.Join(root, "_output", "images"), "directory for <image>.tar, or the archive's path when building one image")
		platforms = flag.String("platforms", o.Platforms[0].String(), "comma-separated os/arch[/variant] to build; every archive holds them all")
		quiet     = flag.Bool("quiet", false, "print only the results")
	)
	flag.StringVar(&o.Repository, "repository", o.Repository, "registry path of the images: <repository>/<image>:<tag>")
	flag.StringVar(&o.TestRepository, "test-repository", o.TestRepository, "registry path of the test images")
	flag.StringVar(&o.Tag, "tag", o.Tag, "image tag (default: the chart's appVersion)")
	flag.StringVar(&o.Version, "version", o.Version, "version in the binaries and the OCI labels (default: the chart's appVersion)")
	flag.BoolVar(&o.NoCache, "no-cache", false, "relink the binaries and recompress every layer instead of reusing the cache")
	flag.BoolVar(&o.Simulation, "simulation", false, "build prism-kubelet-plugin as a test build (-tags "+recipe.SimulationTags+": --fleet, --simulated-faults), for the chart's simulation.fleet on nodes without GPUs; never a release image, so --repository must be another")
	flag.Parse()

	names, err := selectImages(*which)
	if err != nil {
		return err
	}
	o.Platforms = nil
	for _, s := range strings.Split(*platforms, ",") {
		p, err := v1.ParsePlatform(s)
		if err != nil {
			return err
		}
		// go-containerregistry accepts "linux" alone; a Go build needs
		// the architecture.
		if p.OS == "" || p.Architecture == "" {
			return fmt.Errorf("platform %q is not os/arch[/variant]", s)
		}
		o.Platforms = append(o.Platforms, *p)
	}
	outPath := func(name string) string { return filepath.Join(*out, name+".tar") }
	if strings.HasSuffix(*out, ".tar") {
		if len(names) != 1 {
			return fmt.Errorf("--out=%s names one archive, but %d images are to be built", *out, len(names))
		}
		outPath = func(string) string { return *out }
	}
	if !*quiet {
		o.Log = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "[imagebuild] "+format+"\n", args...) }
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	results, err := recipe.Build(ctx, o, names, outPath)
	if err != nil {
		return err
	}
	fmt.Print(summary(o, results, time.Since(start)))
	return nil
}

// selectImages expands a comma-separated list of image names and groups:
// release, test, all.
func selectImages(which string) ([]string, error) {
	groups := map[string][]string{
		"release": recipe.ReleaseImages,
		"test":    recipe.TestImages,
		"all":     append(slices.Clone(recipe.ReleaseImages), recipe.TestImages...),
	}
	var names []string
	for _, w := range strings.Split(which, ",") {
		w = strings.TrimSpace(w)
		add := groups[w]
		if add == nil {
			add = []string{w}
		}
		for _, n := range add {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	return names, nil
}

// summary lists the archives and says how to load, push and install them.
func summary(o recipe.Options, results []recipe.Result, took time.Duration) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "Built %d image(s) for %d platform(s) in %s (version %s, revision %s):\n", len(results), len(o.Platforms), took.Round(100*time.Millisecond), o.Version, o.Revision)
	release := false
	for _, r := range results {
		fmt.Fprintf(&b, "  %-22s %s@%s\n  %-22s %s (%.1f MiB)\n", r.Name, r.Ref, r.Digest, "", relative(r.Path), float64(r.Size)/(1<<20))
		release = release || slices.Contains(recipe.ReleaseImages, r.Name)
	}
	fmt.Fprintf(&b, "\nLoad into containerd:  ctr -n k8s.io images import <archive>\n")
	fmt.Fprintf(&b, "Push to a registry:    skopeo copy oci-archive:<archive> docker://localhost:5000/prismgpu/<image>:%s\n", o.Tag)
	if release {
		fmt.Fprintf(&b, "Install the chart with these images from a local registry:\n")
		fmt.Fprintf(&b, "  helm install prism deployments/helm/prism --set image.repository=localhost:5000/prismgpu --set image.tag=%s\n", o.Tag)
		fmt.Fprintf(&b, "or, imported with ctr under their own names:\n")
		fmt.Fprintf(&b, "  --set image.repository=%s --set image.tag=%s --set image.pullPolicy=Never\n", o.Repository, o.Tag)
		var pins []string
		for _, r := range results {
			if key, ok := digestValues[r.Name]; ok {
				pins = append(pins, fmt.Sprintf("--set image.%s=%s", key, r.Digest))
			}
		}
		fmt.Fprintf(&b, "Pin these builds by digest (after a push that keeps the manifests, such as skopeo copy):\n  %s\n", strings.Join(pins, " "))
	}
	return b.String()
}

// digestValues are the chart values that pin each release image.
var digestValues = map[string]string{
	"prism-kubelet-plugin": "kubeletPluginDigest",
	"prism-controller":     "controllerDigest",
}

func relative(p string) string {
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(r, "..") {
			return r
		}
	}
	return p
}

// repoRoot is the directory of the main module's go.mod above the working
// directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && bytes.HasPrefix(b, []byte("module github.com/prismgpu/prism\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("run imagebuild inside the Prism repository")
		}
		dir = parent
	}
}
