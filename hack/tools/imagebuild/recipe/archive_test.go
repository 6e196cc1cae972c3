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
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

var (
	amd64 = v1.Platform{OS: "linux", Architecture: "amd64"}
	arm64 = v1.Platform{OS: "linux", Architecture: "arm64"}
)

const testRef = "example.test/app:1.2.3"

var testConfig = v1.Config{
	User:       "65532:65532",
	Entrypoint: []string{"/bin/app"},
	Labels:     map[string]string{"org.opencontainers.image.version": "1.2.3"},
}

// written is what an archive says about itself when read back.
type written struct {
	Ref, Digest string
	// Images holds each platform's user, entrypoint, labels and
	// /bin/app.
	Images map[string]writtenImage
}

type writtenImage struct {
	Config v1.Config
	App    string
}

// writeTestArchive builds an image of /bin/app per platform the way Build
// does (tar, gzip into the layer cache, mutate) and writes its archive.
// apps holds /bin/app by architecture.
func writeTestArchive(t *testing.T, dir string, apps map[string]string, platforms []v1.Platform) (digest string, archive []byte) {
	t.Helper()
	var imgs []v1.Image
	for _, p := range platforms {
		raw, diffID, err := layerTar([]entry{{path: "bin/app", kind: kindFile, mode: 0o755, data: []byte(apps[p.Architecture])}}, epoch)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, diffID.Hex+".tar.gz")
		if err := compressLayer(raw, path); err != nil {
			t.Fatal(err)
		}
		l, err := openLayer(path)
		if err != nil {
			t.Fatal(err)
		}
		img, err := newImage(p, testConfig, epoch, []mutate.Addendum{{Layer: l, History: v1.History{Created: v1.Time{Time: epoch}, CreatedBy: "test"}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		imgs = append(imgs, img)
	}
	top := topLevel(imgs, platforms, nil)
	d, err := top.Digest()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "image.tar")
	if err := writeArchive(path, testRef, top, epoch); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return d.String(), b
}

// readTestArchive reads an archive back with ReadArchive.
func readTestArchive(t *testing.T, archive []byte) written {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "image.tar")
	if err := os.WriteFile(path, archive, 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := ReadArchive(path, filepath.Join(dir, "layout"))
	if err != nil {
		t.Fatal(err)
	}
	w := written{Ref: a.Ref, Digest: a.Digest, Images: map[string]writtenImage{}}
	for _, img := range a.Images {
		w.Images[img.Platform.String()] = writtenImage{Config: img.Config, App: app(t, img)}
	}
	return w
}

// app is /bin/app in an image's filesystem.
func app(t *testing.T, img v1.Image) string {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	var app []byte
	err := EachTarEntry(rc, func(h *tar.Header, content io.Reader) error {
		if h.Name != "bin/app" {
			return nil
		}
		var err error
		app, err = io.ReadAll(content)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if app == nil {
		t.Fatalf("no bin/app in the image")
	}
	return string(app)
}

// An archive reads back with the name, digest, configs and files it was
// written with, for one platform (index.json -> manifest) and several
// (index.json -> image index -> manifests). Written twice from the same
// inputs it is byte-identical; a changed file changes its digest.
func TestArchive(t *testing.T) {
	same := map[string]string{"amd64": "amd64", "arm64": "arm64"}
	changed := map[string]string{"amd64": "amd64", "arm64": "arm64, changed"}
	for _, tc := range []struct {
		name          string
		platforms     []v1.Platform
		first, second map[string]string
		wantSame      bool
	}{
		{"one platform, same inputs", []v1.Platform{amd64}, same, same, true},
		{"two platforms, same inputs", []v1.Platform{amd64, arm64}, same, same, true},
		{"one platform, a changed file", []v1.Platform{arm64}, same, changed, false},
		{"two platforms, a changed file", []v1.Platform{amd64, arm64}, same, changed, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d1, a1 := writeTestArchive(t, t.TempDir(), tc.first, tc.platforms)
			d2, a2 := writeTestArchive(t, t.TempDir(), tc.second, tc.platforms)

			want := written{Ref: testRef, Digest: d1, Images: map[string]writtenImage{}}
			for _, p := range tc.platforms {
				want.Images[p.String()] = writtenImage{Config: testConfig, App: tc.first[p.Architecture]}
			}
			if diff := cmp.Diff(want, readTestArchive(t, a1)); diff != "" {
				t.Errorf("archive read back (-want +got):\n%s", diff)
			}

			if diff := cmp.Diff(d1, d2); (diff == "") != tc.wantSame {
				t.Errorf("digests equal: %v, want %v (-first +second):\n%s", diff == "", tc.wantSame, diff)
			}
			if bytes.Equal(a1, a2) != tc.wantSame {
				t.Errorf("archives byte-identical: %v, want %v", bytes.Equal(a1, a2), tc.wantSame)
			}
		})
	}
}

func TestWriteArchiveNeedsATag(t *testing.T) {
	for _, ref := range []string{"example.test/app", "localhost:5000/app", "app:1.2.3"} {
		t.Run(ref, func(t *testing.T) {
			if err := writeArchive(filepath.Join(t.TempDir(), "image.tar"), ref, empty.Image, epoch); err == nil {
				t.Errorf("writeArchive(%q) succeeded, want an error for the missing tag or registry", ref)
			}
		})
	}
}
