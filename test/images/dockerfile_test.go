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
	"archive/tar"
	"encoding/json"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
)

// images/Dockerfile is what a user's CI builds with Docker or Buildah; it
// cannot run here (no registry for its base images), so its final stages
// are held to the images make images builds.
func TestDockerfileMatchesTheBuilder(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot, "images/Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(b), "\\\n", " ")
	stages := map[string][]string{}
	var stage string
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if f := strings.Fields(line); len(f) == 4 && f[0] == "FROM" && strings.EqualFold(f[2], "AS") {
			stage = f[3]
		}
		stages[stage] = append(stages[stage], line)
	}
	instruction := func(stage, name string) string {
		for _, line := range stages[stage] {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				return v
			}
		}
		return ""
	}

	for _, name := range recipe.ReleaseImages {
		t.Run(name, func(t *testing.T) {
			want, _ := recipe.Config(name)
			if _, ok := stages[name]; !ok {
				t.Fatalf("no stage %s", name)
			}
			if got := instruction(name, "USER"); got != want.User {
				t.Errorf("USER %q, want %q", got, want.User)
			}
			var entrypoint []string
			if err := json.Unmarshal([]byte(instruction(name, "ENTRYPOINT")), &entrypoint); err != nil {
				t.Errorf("ENTRYPOINT: %v", err)
			}
			if !slices.Equal(entrypoint, want.Entrypoint) {
				t.Errorf("ENTRYPOINT %q, want %q", entrypoint, want.Entrypoint)
			}
		})
	}

	// Every file the builder adds besides Debian's and its own base files
	// is copied in by the stage, to the same directory.
	t.Run("prism-kubelet-plugin files", func(t *testing.T) {
		var copies []string
		for _, line := range stages["prism-kubelet-plugin"] {
			if strings.HasPrefix(line, "COPY --from=build ") {
				copies = append(copies, line)
			}
		}
		for p, h := range files(t, "prism-kubelet-plugin") {
			if h.Typeflag != tar.TypeReg || !(strings.HasPrefix(p, "usr/bin/") || strings.HasPrefix(p, "usr/libexec/")) {
				continue
			}
			if !slices.ContainsFunc(copies, func(c string) bool {
				f := strings.Fields(c)
				return f[len(f)-1] == "/"+path.Dir(p)+"/" && slices.Contains(f, "/out/"+path.Base(p))
			}) {
				t.Errorf("the builder's /%s is not copied to /%s/ by the Dockerfile", p, path.Dir(p))
			}
		}
	})

	t.Run("busybox applets", func(t *testing.T) {
		m := regexp.MustCompile(`for a in ([^;]*); do`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no applet loop")
		}
		got := strings.Fields(m[1])
		want := slices.Clone(recipe.BusyboxApplets)
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("applets %q, want %q", got, want)
		}
	})

	t.Run("Debian packages", func(t *testing.T) {
		m := regexp.MustCompile(`apt-get download ([^;]*);`).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("no apt-get download")
		}
		got := strings.Fields(m[1])
		var want []string
		for _, p := range strings.Fields(image(t, "prism-kubelet-plugin").Config.Labels["dev.prism.debian.packages"]) {
			want = append(want, p[:strings.IndexAny(p, ":=")])
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("downloads %q, the plugin image is made of %q", got, want)
		}
	})
}
