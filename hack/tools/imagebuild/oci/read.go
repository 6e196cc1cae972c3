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
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// Archive is an OCI layout archive read into memory, for inspection.
type Archive struct {
	// Ref is the full reference the archive names its image by.
	Ref string
	// Digest is the top descriptor's: the manifest, or the image index of
	// a multi-platform image.
	Digest string
	Images []ReadImage
	blobs  map[string][]byte
}

// ReadImage is one platform's image of an archive.
type ReadImage struct {
	Platform       Platform
	ManifestDigest string
	Annotations    map[string]string
	Config         Config
	// Layers holds the gzipped layers, bottom first.
	Layers [][]byte
}

// ReadArchive reads an archive written by WriteArchive (or any OCI layout
// tar with one image) and checks every blob against its digest.
func ReadArchive(path string) (*Archive, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	a := &Archive{blobs: map[string][]byte{}}
	var layout []byte
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", path, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, fmt.Errorf("reading %s from %s: %w", h.Name, path, err)
		}
		switch {
		case h.Name == "index.json":
			layout = b
		case strings.HasPrefix(h.Name, "blobs/sha256/"):
			d := "sha256:" + strings.TrimPrefix(h.Name, "blobs/sha256/")
			if got := Digest(b); got != d {
				return nil, fmt.Errorf("%s: blob %s has digest %s", path, d, got)
			}
			a.blobs[d] = b
		}
	}
	var top index
	if err := json.Unmarshal(layout, &top); err != nil {
		return nil, fmt.Errorf("%s: index.json: %w", path, err)
	}
	if len(top.Manifests) != 1 {
		return nil, fmt.Errorf("%s: index.json lists %d images, want 1", path, len(top.Manifests))
	}
	d := top.Manifests[0]
	a.Ref, a.Digest = d.Annotations[AnnotationImageName], d.Digest
	manifests := []descriptor{d}
	if d.MediaType == MediaTypeIndex {
		var idx index
		if err := a.unmarshal(d.Digest, &idx); err != nil {
			return nil, err
		}
		manifests = idx.Manifests
	}
	for _, md := range manifests {
		var m manifest
		if err := a.unmarshal(md.Digest, &m); err != nil {
			return nil, err
		}
		var cfg imageConfig
		if err := a.unmarshal(m.Config.Digest, &cfg); err != nil {
			return nil, err
		}
		img := ReadImage{
			Platform:       Platform{OS: cfg.OS, Architecture: cfg.Architecture, Variant: cfg.Variant},
			ManifestDigest: md.Digest,
			Annotations:    m.Annotations,
			Config:         cfg.Config,
		}
		if len(m.Layers) != len(cfg.RootFS.DiffIDs) {
			return nil, fmt.Errorf("%s: manifest %s has %d layers, its config %d diff IDs", path, md.Digest, len(m.Layers), len(cfg.RootFS.DiffIDs))
		}
		for i, l := range m.Layers {
			b, ok := a.blobs[l.Digest]
			if !ok {
				return nil, fmt.Errorf("%s: layer %s missing", path, l.Digest)
			}
			raw, err := gunzip(b)
			if err != nil {
				return nil, fmt.Errorf("%s: layer %s: %w", path, l.Digest, err)
			}
			if got := Digest(raw); got != cfg.RootFS.DiffIDs[i] {
				return nil, fmt.Errorf("%s: layer %s unpacks to %s, its config says %s", path, l.Digest, got, cfg.RootFS.DiffIDs[i])
			}
			img.Layers = append(img.Layers, b)
		}
		a.Images = append(a.Images, img)
	}
	return a, nil
}

func (a *Archive) unmarshal(digest string, v any) error {
	b, ok := a.blobs[digest]
	if !ok {
		return fmt.Errorf("blob %s missing", digest)
	}
	return json.Unmarshal(b, v)
}

func gunzip(b []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	return io.ReadAll(zr)
}

// Image returns the image of a platform.
func (a *Archive) Image(p Platform) (ReadImage, error) {
	for _, img := range a.Images {
		if img.Platform == p {
			return img, nil
		}
	}
	return ReadImage{}, fmt.Errorf("%s has no %s image", a.Ref, p)
}

// Files lists the image's files as the runtime sees them, upper layers
// over lower ones, by path relative to the root.
func (img ReadImage) Files() (map[string]*tar.Header, error) {
	files := map[string]*tar.Header{}
	err := img.Walk(func(h *tar.Header, _ io.Reader) error {
		files[strings.TrimSuffix(filepath.Clean(h.Name), "/")] = h
		return nil
	})
	return files, err
}

// Unpack writes the image's root filesystem into dir, with owners and
// modes, as a runtime would before starting a container.
func (img ReadImage) Unpack(dir string) error {
	return img.Walk(func(h *tar.Header, r io.Reader) error {
		name := filepath.Clean(h.Name)
		if name == ".." || strings.HasPrefix(name, "../") || filepath.IsAbs(name) {
			return fmt.Errorf("layer entry %q escapes the root", h.Name)
		}
		p := filepath.Join(dir, name)
		mode := os.FileMode(h.Mode).Perm()
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.Remove(p)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, r)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(p)
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
			return os.Lchown(p, h.Uid, h.Gid)
		default:
			return fmt.Errorf("layer entry %s: unsupported type %q", h.Name, h.Typeflag)
		}
		if err := os.Chmod(p, FileMode(h.Mode)); err != nil {
			return err
		}
		return os.Lchown(p, h.Uid, h.Gid)
	})
}

// Walk calls fn for every entry of every layer, bottom layer first, with
// the entry's content.
func (img ReadImage) Walk(fn func(*tar.Header, io.Reader) error) error {
	for i, b := range img.Layers {
		zr, err := gzip.NewReader(bytes.NewReader(b))
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		tr := tar.NewReader(zr)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return fmt.Errorf("layer %d: %w", i, err)
			}
			if err := fn(h, tr); err != nil {
				return fmt.Errorf("layer %d, %s: %w", i, h.Name, err)
			}
		}
	}
	return nil
}
