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

// Package oci writes and reads container images as OCI image layout
// archives (a tar of oci-layout, index.json and blobs/sha256/...), the
// format `ctr images import`, skopeo's oci-archive: and crane accept. It
// needs no daemon and no registry, and it writes the same bytes for the
// same inputs: entries sorted, one timestamp, owner 0:0, gzip without a
// name or time.
package oci

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Kind is the type of a layer entry.
type Kind int

const (
	File Kind = iota
	Dir
	Symlink
)

// Entry is one file, directory or symlink of a layer.
type Entry struct {
	// Path inside the image, relative to its root ("usr/bin/x").
	Path string
	Kind Kind
	// Mode holds the permission bits (and setuid/setgid/sticky).
	Mode fs.FileMode
	// Data is a file's content.
	Data []byte
	// Target is a symlink's target.
	Target string
	UID    int
	GID    int
}

// Layer is an uncompressed layer tar and its digest (the image config's
// diff ID).
type Layer struct {
	Tar    []byte
	DiffID string
}

// BuildLayer writes entries as a tar sorted by path, every entry stamped
// with mtime. Parent directories that entries leave out are added as
// root-owned 0755 directories, so an unpacker never invents their modes.
// Two entries with the same path are an error: which one wins would depend
// on the order they were gathered in.
func BuildLayer(entries []Entry, mtime time.Time) (Layer, error) {
	byPath := map[string]Entry{}
	for _, e := range entries {
		p, err := cleanPath(e.Path)
		if err != nil {
			return Layer{}, err
		}
		e.Path = p
		if old, ok := byPath[p]; ok && !(old.Kind == Dir && e.Kind == Dir) {
			return Layer{}, fmt.Errorf("layer has %s twice", p)
		}
		byPath[p] = e
	}
	for p := range byPath {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = Entry{Path: d, Kind: Dir, Mode: 0o755}
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime = mtime.UTC().Truncate(time.Second)
	for _, p := range paths {
		e := byPath[p]
		h := &tar.Header{
			Name:    p,
			Mode:    tarMode(e.Mode),
			Uid:     e.UID,
			Gid:     e.GID,
			ModTime: mtime,
			Format:  tar.FormatPAX,
		}
		switch e.Kind {
		case File:
			h.Typeflag = tar.TypeReg
			h.Size = int64(len(e.Data))
		case Dir:
			h.Typeflag = tar.TypeDir
			h.Name += "/"
		case Symlink:
			h.Typeflag = tar.TypeSymlink
			h.Linkname = e.Target
		default:
			return Layer{}, fmt.Errorf("%s: unknown entry kind %d", p, e.Kind)
		}
		if err := tw.WriteHeader(h); err != nil {
			return Layer{}, fmt.Errorf("writing %s: %w", p, err)
		}
		if e.Kind == File {
			if _, err := tw.Write(e.Data); err != nil {
				return Layer{}, fmt.Errorf("writing %s: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return Layer{}, err
	}
	return Layer{Tar: buf.Bytes(), DiffID: Digest(buf.Bytes())}, nil
}

// tarMode keeps the permission and special bits in tar's (Unix) encoding.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// FileMode is the fs.FileMode of a tar header's mode: permissions and the
// setuid, setgid and sticky bits.
func FileMode(tarMode int64) fs.FileMode {
	m := fs.FileMode(tarMode).Perm()
	if tarMode&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if tarMode&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if tarMode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func cleanPath(p string) (string, error) {
	c := path.Clean(strings.TrimPrefix(p, "/"))
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("layer entry path %q is outside the image root", p)
	}
	return c, nil
}

// Digest is the OCI digest (sha256:<hex>) of b.
func Digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// digestOf hashes what it reads from r.
func digestOf(r io.Reader) (string, int64, error) {
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		return "", 0, err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), n, nil
}
