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

package images

import (
	"bytes"
	"context"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
)

// simulationFacts are what tells the two builds of the plugin image apart.
type simulationFacts struct {
	// BuildTags is the image's label dev.prism.build-tags.
	BuildTags string
	// NVMLMock: the binary has functions of go-nvml's mock, which serves
	// simulated GPUs. A stripped Go binary still names its functions (the
	// runtime's own table, for stack traces).
	NVMLMock bool
}

func simulationFactsOf(t *testing.T, name string, img recipe.ArchiveImage) simulationFacts {
	t.Helper()
	bin := readFrom(t, name, img, "usr/bin/prism-kubelet-plugin")
	return simulationFacts{
		BuildTags: img.Config.Labels["dev.prism.build-tags"],
		NVMLMock:  bytes.Contains(bin, []byte("github.com/NVIDIA/go-nvml/pkg/nvml/mock.")),
	}
}

// The release plugin image has no simulated GPUs. The test build, which the
// Helm e2e installs with a simulated fleet, has them and says so in a label,
// and the builder refuses to name it like a release image.
func TestSimulationBuild(t *testing.T) {
	o, _ := images(t)
	if diff := cmp.Diff(simulationFacts{}, simulationFactsOf(t, "release prism-kubelet-plugin", image(t, "prism-kubelet-plugin"))); diff != "" {
		t.Errorf("release prism-kubelet-plugin (-want +got):\n%s", diff)
	}

	o.Simulation = true
	dir := t.TempDir()
	out := func(n string) string { return filepath.Join(dir, n+".tar") }
	if _, err := recipe.Build(context.Background(), o, []string{"prism-kubelet-plugin"}, out); err == nil || !strings.Contains(err.Error(), "must not be named like a release image") {
		t.Errorf("a simulation build named under %s: %v, want a refusal", o.Repository, err)
	}

	o.Repository = "localhost/prism-sim"
	results, err := recipe.Build(context.Background(), o, []string{"prism-kubelet-plugin"}, out)
	if err != nil {
		t.Fatal(err)
	}
	a, err := recipe.ReadArchive(results[0].Path, filepath.Join(dir, "read"))
	if err != nil {
		t.Fatal(err)
	}
	img, err := a.Image(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})
	if err != nil {
		t.Fatal(err)
	}
	if want := "localhost/prism-sim/prism-kubelet-plugin:" + o.Tag; results[0].Ref != want {
		t.Errorf("the simulation build is named %q, want %q", results[0].Ref, want)
	}
	if diff := cmp.Diff(simulationFacts{BuildTags: recipe.SimulationTags, NVMLMock: true}, simulationFactsOf(t, "simulation prism-kubelet-plugin", img)); diff != "" {
		t.Errorf("simulation prism-kubelet-plugin (-want +got):\n%s", diff)
	}
}
