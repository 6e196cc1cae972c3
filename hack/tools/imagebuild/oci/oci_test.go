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

package oci

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

var epoch = time.Unix(1700000000, 0)

func TestBuildLayer(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []Entry
		// want lists the tar's names in order; empty with wantErr.
		want    []string
		wantErr bool
	}{
		{
			name: "sorted, parents added",
			entries: []Entry{
				{Path: "usr/bin/b", Kind: File, Mode: 0o755, Data: []byte("b")},
				{Path: "/etc/passwd", Kind: File, Mode: 0o644, Data: []byte("root")},
				{Path: "bin/sh", Kind: Symlink, Target: "busybox"},
			},
			want: []string{"bin/", "bin/sh", "etc/", "etc/passwd", "usr/", "usr/bin/", "usr/bin/b"},
		},
		{
			name: "a directory given twice is one",
			entries: []Entry{
				{Path: "tmp", Kind: Dir, Mode: 0o777 | fs.ModeSticky},
				{Path: "tmp/", Kind: Dir, Mode: 0o777 | fs.ModeSticky},
			},
			want: []string{"tmp/"},
		},
		{
			name:    "a file given twice",
			entries: []Entry{{Path: "a", Kind: File}, {Path: "/a", Kind: File}},
			wantErr: true,
		},
		{
			name:    "outside the root",
			entries: []Entry{{Path: "../etc/passwd", Kind: File}},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := BuildLayer(tc.entries, epoch)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("BuildLayer succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			tr := tar.NewReader(bytes.NewReader(l.Tar))
			for {
				h, err := tr.Next()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				names = append(names, h.Name)
				if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 {
					t.Errorf("%s: mtime %v owner %d:%d, want %v and 0:0", h.Name, h.ModTime, h.Uid, h.Gid, epoch)
				}
			}
			if !slices.Equal(names, tc.want) {
				t.Errorf("entries %q, want %q", names, tc.want)
			}
		})
	}
}

func TestBuildLayerIgnoresInputOrder(t *testing.T) {
	a := []Entry{{Path: "x", Kind: File, Data: []byte("1")}, {Path: "y/z", Kind: File, Data: []byte("2")}}
	b := []Entry{a[1], a[0]}
	la, err := BuildLayer(a, epoch)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := BuildLayer(b, epoch)
	if err != nil {
		t.Fatal(err)
	}
	if la.DiffID != lb.DiffID {
		t.Errorf("same entries in another order: %s, then %s", la.DiffID, lb.DiffID)
	}
}

// An archive reads back with the names, configs and files it was written
// with, for one platform (index.json -> manifest) and several (index.json
// -> image index -> manifests).
func TestArchiveRoundTrip(t *testing.T) {
	dir := t.TempDir()
	layer := func(data string) CompressedLayer {
		l, err := BuildLayer([]Entry{{Path: "bin/app", Kind: File, Mode: 0o755, Data: []byte(data)}}, epoch)
		if err != nil {
			t.Fatal(err)
		}
		c, err := Compress(l, filepath.Join(dir, data+".tar.gz"))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	amd64, arm64 := Platform{OS: "linux", Architecture: "amd64"}, Platform{OS: "linux", Architecture: "arm64"}
	cfg := Config{User: "65532:65532", Entrypoint: []string{"/bin/app"}, Labels: map[string]string{"org.opencontainers.image.version": "1.2.3"}}
	for _, tc := range []struct {
		name   string
		images []Image
	}{
		{"one platform", []Image{{Platform: amd64, Config: cfg, Created: epoch, Layers: []CompressedLayer{layer("amd64")}}}},
		{"two platforms", []Image{
			{Platform: amd64, Config: cfg, Created: epoch, Layers: []CompressedLayer{layer("amd64")}},
			{Platform: arm64, Config: cfg, Created: epoch, Layers: []CompressedLayer{layer("arm64")}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, "image.tar")
			var buf bytes.Buffer
			w, err := WriteArchive(&buf, "example.test/app:1.2.3", nil, tc.images, epoch)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
				t.Fatal(err)
			}
			a, err := ReadArchive(path)
			if err != nil {
				t.Fatal(err)
			}
			if a.Ref != "example.test/app:1.2.3" || a.Digest != w.Digest {
				t.Errorf("read %s@%s, wrote example.test/app:1.2.3@%s", a.Ref, a.Digest, w.Digest)
			}
			if len(a.Images) != len(tc.images) {
				t.Fatalf("read %d images, wrote %d", len(a.Images), len(tc.images))
			}
			for _, want := range tc.images {
				img, err := a.Image(want.Platform)
				if err != nil {
					t.Fatal(err)
				}
				if img.ManifestDigest != w.Manifests[want.Platform.String()] {
					t.Errorf("%s manifest %s, wrote %s", want.Platform, img.ManifestDigest, w.Manifests[want.Platform.String()])
				}
				if img.Config.User != cfg.User || !slices.Equal(img.Config.Entrypoint, cfg.Entrypoint) || img.Config.Labels["org.opencontainers.image.version"] != "1.2.3" {
					t.Errorf("%s config %+v, wrote %+v", want.Platform, img.Config, cfg)
				}
				root := t.TempDir()
				if err := img.Unpack(root); err != nil {
					t.Fatal(err)
				}
				got, err := os.ReadFile(filepath.Join(root, "bin/app"))
				if err != nil || string(got) != want.Platform.Architecture {
					t.Errorf("%s /bin/app holds %q (%v), want %q", want.Platform, got, err, want.Platform.Architecture)
				}
			}
			var again bytes.Buffer
			if _, err := WriteArchive(&again, "example.test/app:1.2.3", nil, tc.images, epoch); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(buf.Bytes(), again.Bytes()) {
				t.Errorf("writing the same images twice gave different archives")
			}
		})
	}
}

func TestWriteArchiveNeedsATag(t *testing.T) {
	img := Image{Platform: Platform{OS: "linux", Architecture: "amd64"}}
	for _, ref := range []string{"example.test/app", "localhost:5000/app"} {
		if _, err := WriteArchive(io.Discard, ref, nil, []Image{img}, epoch); err == nil {
			t.Errorf("WriteArchive(%q) succeeded, want an error for the missing tag", ref)
		}
	}
}
