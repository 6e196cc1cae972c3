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
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"

	"github.com/prismgpu/prism/internal/atomicfile"
)

// Annotations on the archive's index.json entry.
const (
	// annotationRefName is the OCI layout's name of an image: its tag.
	annotationRefName = "org.opencontainers.image.ref.name"
	// annotationImageName is the full reference `ctr images import`
	// names the image by.
	annotationImageName = "io.containerd.image.name"
)

// compressLayer gzips a layer tar into path. go-containerregistry
// compresses with the standard library's gzip, which writes no name and no
// time, so a fixed level gives the same bytes for the same tar.
func compressLayer(raw []byte, path string) error {
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(raw)), nil
	}, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return err
	}
	rc, err := l.Compressed()
	if err != nil {
		return err
	}
	defer rc.Close()
	return atomicfile.Write(path, 0o644, func(w io.Writer) error {
		_, err := io.Copy(w, rc)
		return err
	})
}

// openLayer is a compressed layer from compressLayer, as an OCI layer.
func openLayer(path string) (v1.Layer, error) {
	return tarball.LayerFromFile(path, tarball.WithMediaType(types.OCILayer))
}

// newImage is one platform's image: an OCI manifest over the layers, bottom
// first, with annotations on the manifest.
func newImage(p v1.Platform, cfg v1.Config, created time.Time, layers []mutate.Addendum, annotations map[string]string) (v1.Image, error) {
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	base, err := mutate.ConfigFile(base, &v1.ConfigFile{
		Created:      v1.Time{Time: created.UTC()},
		OS:           p.OS,
		Architecture: p.Architecture,
		Variant:      p.Variant,
		Config:       cfg,
		RootFS:       v1.RootFS{Type: "layers"},
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.Append(base, layers...)
	if err != nil {
		return nil, err
	}
	return mutate.Annotations(img, annotations).(v1.Image), nil
}

// topLevel is what an archive names: the image of one platform (a push
// keeps its manifest), or the image index of several.
func topLevel(images []v1.Image, platforms []v1.Platform, annotations map[string]string) mutate.Appendable {
	if len(images) == 1 {
		return images[0]
	}
	var adds []mutate.IndexAddendum
	for i, img := range images {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &platforms[i]}})
	}
	return mutate.Annotations(mutate.AppendManifests(empty.Index, adds...), annotations).(v1.ImageIndex)
}

// writeArchive writes top (an image, or the index of a multi-platform
// image) to path as an OCI image layout tar naming it ref
// (registry/path:tag): the format `ctr images import`, skopeo's
// oci-archive: and crane read. go-containerregistry writes the layout as a
// directory; the tar around it is stamped with mtime and sorted, so it is
// byte-identical too.
func writeArchive(path, ref string, top mutate.Appendable, mtime time.Time) error {
	tag, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	desc := v1.Descriptor{Annotations: map[string]string{annotationRefName: tag.TagStr(), annotationImageName: ref}}
	// A one-platform image says its platform here, where an index would
	// say it for each manifest, so `ctr images import` can match it
	// without reading the config.
	if img, ok := top.(v1.Image); ok {
		cf, err := img.ConfigFile()
		if err != nil {
			return err
		}
		desc.Platform = cf.Platform()
	}
	idx := mutate.AppendManifests(empty.Index, mutate.IndexAddendum{Add: top, Descriptor: desc})
	if _, err := layout.Write(dir, idx); err != nil {
		return err
	}
	return atomicfile.Write(path, 0o644, func(w io.Writer) error { return tarDir(w, dir, mtime) })
}

// tarDir writes the files under dir in lexical order, owned by 0:0 and
// stamped with mtime.
func tarDir(w io.Writer, dir string, mtime time.Time) error {
	tw := tar.NewWriter(w)
	mtime = mtime.UTC().Truncate(time.Second)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		h := &tar.Header{Name: filepath.ToSlash(rel), ModTime: mtime, Format: tar.FormatPAX}
		if d.IsDir() {
			h.Typeflag, h.Name, h.Mode = tar.TypeDir, h.Name+"/", 0o755
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Typeflag, h.Mode, h.Size = tar.TypeReg, 0o644, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// Archive is an image archive read back, for inspection.
type Archive struct {
	// Ref is the full reference the archive names its image by.
	Ref string
	// Digest is the top descriptor's: the manifest, or the image index of
	// a multi-platform image.
	Digest string
	Images []ArchiveImage
}

// ArchiveImage is one platform's image of an archive.
type ArchiveImage struct {
	v1.Image
	Platform v1.Platform
	Config   v1.Config
}

// ReadArchive unpacks an archive written by Build (or any OCI layout tar
// with one image) into dir, which must outlive the images' use, and checks
// every blob against its digest and every layer against its diff ID.
func ReadArchive(path, dir string) (*Archive, error) {
	if err := untar(path, dir); err != nil {
		return nil, err
	}
	lp, err := layout.FromPath(dir)
	if err != nil {
		return nil, err
	}
	idx, err := lp.ImageIndex()
	if err != nil {
		return nil, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	if len(im.Manifests) != 1 {
		return nil, fmt.Errorf("%s: index.json lists %d images, want 1", path, len(im.Manifests))
	}
	d := im.Manifests[0]
	a := &Archive{Ref: d.Annotations[annotationImageName], Digest: d.Digest.String()}
	var images []v1.Image
	switch {
	case d.MediaType.IsIndex():
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		if err := validate.Index(child); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		cm, err := child.IndexManifest()
		if err != nil {
			return nil, err
		}
		for _, m := range cm.Manifests {
			img, err := child.Image(m.Digest)
			if err != nil {
				return nil, err
			}
			images = append(images, img)
		}
	case d.MediaType.IsImage():
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, err
		}
		if err := validate.Image(img); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		images = append(images, img)
	default:
		return nil, fmt.Errorf("%s: index.json names a %s, want an image or an index", path, d.MediaType)
	}
	for _, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, err
		}
		a.Images = append(a.Images, ArchiveImage{Image: img, Platform: *cf.Platform(), Config: cf.Config})
	}
	return a, nil
}

// Image returns the image of a platform.
func (a *Archive) Image(p v1.Platform) (ArchiveImage, error) {
	for _, img := range a.Images {
		if img.Platform.Equals(p) {
			return img, nil
		}
	}
	return ArchiveImage{}, fmt.Errorf("%s has no %s image", a.Ref, p)
}

// untar writes an archive's directories and regular files under dir.
func untar(path, dir string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = EachTarEntry(f, func(h *tar.Header, content io.Reader) error {
		rel, err := cleanPath(h.Name)
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(rel))
		switch h.Typeflag {
		case tar.TypeDir:
			return os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			return atomicfile.Write(p, 0o644, func(w io.Writer) error {
				_, err := io.Copy(w, content)
				return err
			})
		default:
			return fmt.Errorf("unexpected entry type %q", h.Typeflag)
		}
	})
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// EachTarEntry calls fn with every entry of a tar stream and its content,
// in order, and stops at the first error; fn's error names the entry.
func EachTarEntry(r io.Reader, fn func(h *tar.Header, content io.Reader) error) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tar: %w", err)
		}
		if err := fn(h, tr); err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
	}
}
