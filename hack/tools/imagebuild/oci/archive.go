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
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"time"
)

// Media types and annotations this package writes.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"

	// AnnotationRefName is the OCI layout's name of an image: its tag.
	AnnotationRefName = "org.opencontainers.image.ref.name"
	// AnnotationImageName is the full reference `ctr images import`
	// names the image by.
	AnnotationImageName = "io.containerd.image.name"
)

// Platform is an image's OS and CPU architecture.
type Platform struct {
	OS           string `json:"os"`
	Architecture string `json:"architecture"`
	Variant      string `json:"variant,omitempty"`
}

// ParsePlatform reads "linux/amd64" or "linux/arm64/v8".
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Platform{}, fmt.Errorf("platform %q is not os/arch[/variant]", s)
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

func (p Platform) String() string {
	s := p.OS + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

// Config is the part of the image config a container runtime runs by.
type Config struct {
	User       string            `json:"User,omitempty"`
	Env        []string          `json:"Env,omitempty"`
	Entrypoint []string          `json:"Entrypoint,omitempty"`
	Cmd        []string          `json:"Cmd,omitempty"`
	WorkingDir string            `json:"WorkingDir,omitempty"`
	Labels     map[string]string `json:"Labels,omitempty"`
}

// CompressedLayer is a gzipped layer blob stored in a file.
type CompressedLayer struct {
	DiffID string
	Digest string
	Size   int64
	Path   string
	// CreatedBy says in the image history what the layer holds.
	CreatedBy string
}

// Compress gzips a layer into path, deterministically: no name, no time,
// the same level every time.
func Compress(l Layer, path string) (CompressedLayer, error) {
	tmp, err := os.CreateTemp(dirOf(path), ".layer-*")
	if err != nil {
		return CompressedLayer{}, err
	}
	defer os.Remove(tmp.Name())
	zw, err := gzip.NewWriterLevel(tmp, gzip.BestSpeed)
	if err == nil {
		_, err = zw.Write(l.Tar)
	}
	if err == nil {
		err = zw.Close()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return CompressedLayer{}, fmt.Errorf("compressing layer %s: %w", l.DiffID, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return CompressedLayer{}, err
	}
	return OpenCompressed(l.DiffID, path)
}

// OpenCompressed describes a gzipped layer written before by Compress.
func OpenCompressed(diffID, path string) (CompressedLayer, error) {
	f, err := os.Open(path)
	if err != nil {
		return CompressedLayer{}, err
	}
	defer f.Close()
	d, n, err := digestOf(f)
	if err != nil {
		return CompressedLayer{}, fmt.Errorf("reading layer %s: %w", path, err)
	}
	return CompressedLayer{DiffID: diffID, Digest: d, Size: n, Path: path}, nil
}

func dirOf(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		return p[:i]
	}
	return "."
}

// Image is one platform's image: its config and layers, bottom first.
type Image struct {
	Platform Platform
	Config   Config
	Created  time.Time
	Layers   []CompressedLayer
}

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

type manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        descriptor        `json:"config"`
	Layers        []descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type index struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Manifests     []descriptor      `json:"manifests"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

type imageConfig struct {
	Created      string    `json:"created"`
	Architecture string    `json:"architecture"`
	OS           string    `json:"os"`
	Variant      string    `json:"variant,omitempty"`
	Config       Config    `json:"config"`
	RootFS       rootFS    `json:"rootfs"`
	History      []history `json:"history,omitempty"`
}

type rootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

type history struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by,omitempty"`
}

// Written says what WriteArchive wrote.
type Written struct {
	// Digest is what a registry will call the image after a push that
	// keeps the manifests' bytes (skopeo copy, crane push): the manifest's
	// for one platform, the image index's for several.
	Digest string
	// Manifests holds each platform's manifest digest.
	Manifests map[string]string
}

// WriteArchive writes images, one per platform, as an OCI layout tar named
// ref (registry/path:tag). annotations go on the manifests and the index.
func WriteArchive(w io.Writer, ref string, annotations map[string]string, images []Image, mtime time.Time) (Written, error) {
	if len(images) == 0 {
		return Written{}, fmt.Errorf("no image to write for %s", ref)
	}
	tag := ref[strings.LastIndexByte(ref, ':')+1:]
	if !strings.Contains(ref, ":") || strings.Contains(tag, "/") {
		return Written{}, fmt.Errorf("image reference %q has no tag", ref)
	}
	small := map[string][]byte{}
	files := map[string]CompressedLayer{}
	addJSON := func(v any) (string, int64, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return "", 0, err
		}
		d := Digest(b)
		small[d] = b
		return d, int64(len(b)), nil
	}
	out := Written{Manifests: map[string]string{}}
	var platforms []descriptor
	for _, img := range images {
		cfg := imageConfig{
			Created:      img.Created.UTC().Format(time.RFC3339),
			Architecture: img.Platform.Architecture,
			OS:           img.Platform.OS,
			Variant:      img.Platform.Variant,
			Config:       img.Config,
			RootFS:       rootFS{Type: "layers"},
		}
		m := manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Annotations: annotations}
		for _, l := range img.Layers {
			cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, l.DiffID)
			cfg.History = append(cfg.History, history{Created: cfg.Created, CreatedBy: l.CreatedBy})
			m.Layers = append(m.Layers, descriptor{MediaType: MediaTypeLayer, Digest: l.Digest, Size: l.Size})
			files[l.Digest] = l
		}
		d, n, err := addJSON(cfg)
		if err != nil {
			return Written{}, err
		}
		m.Config = descriptor{MediaType: MediaTypeConfig, Digest: d, Size: n}
		d, n, err = addJSON(m)
		if err != nil {
			return Written{}, err
		}
		p := img.Platform
		platforms = append(platforms, descriptor{MediaType: MediaTypeManifest, Digest: d, Size: n, Platform: &p})
		out.Manifests[p.String()] = d
	}
	names := map[string]string{AnnotationRefName: tag, AnnotationImageName: ref}
	top := platforms[0]
	if len(platforms) > 1 {
		d, n, err := addJSON(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: platforms, Annotations: annotations})
		if err != nil {
			return Written{}, err
		}
		top = descriptor{MediaType: MediaTypeIndex, Digest: d, Size: n}
	}
	out.Digest = top.Digest
	top.Annotations = names
	layout, err := json.Marshal(index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []descriptor{top}})
	if err != nil {
		return Written{}, err
	}

	tw := tar.NewWriter(w)
	mt := mtime.UTC().Truncate(time.Second)
	writeHeader := func(name string, typ byte, size int64, mode int64) error {
		return tw.WriteHeader(&tar.Header{Name: name, Typeflag: typ, Size: size, Mode: mode, ModTime: mt, Format: tar.FormatPAX})
	}
	if err := writeHeader("blobs/", tar.TypeDir, 0, 0o755); err != nil {
		return Written{}, err
	}
	if err := writeHeader("blobs/sha256/", tar.TypeDir, 0, 0o755); err != nil {
		return Written{}, err
	}
	var digests []string
	for d := range small {
		digests = append(digests, d)
	}
	for d := range files {
		if _, ok := small[d]; !ok {
			digests = append(digests, d)
		}
	}
	sort.Strings(digests)
	for _, d := range digests {
		name := "blobs/sha256/" + strings.TrimPrefix(d, "sha256:")
		if b, ok := small[d]; ok {
			if err := writeHeader(name, tar.TypeReg, int64(len(b)), 0o644); err != nil {
				return Written{}, err
			}
			if _, err := tw.Write(b); err != nil {
				return Written{}, err
			}
			continue
		}
		l := files[d]
		if err := writeHeader(name, tar.TypeReg, l.Size, 0o644); err != nil {
			return Written{}, err
		}
		if err := copyFile(tw, l.Path, l.Size); err != nil {
			return Written{}, fmt.Errorf("adding layer %s: %w", l.Path, err)
		}
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{"index.json", layout},
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	} {
		if err := writeHeader(f.name, tar.TypeReg, int64(len(f.data)), 0o644); err != nil {
			return Written{}, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return Written{}, err
		}
	}
	return out, tw.Close()
}

func copyFile(w io.Writer, path string, size int64) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(w, f)
	if err == nil && n != size {
		err = fmt.Errorf("%s changed while being written: %d bytes, want %d", path, n, size)
	}
	return err
}
