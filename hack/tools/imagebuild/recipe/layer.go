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
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// entryKind is the type of a layer entry.
type entryKind int

const (
	kindFile entryKind = iota
	kindDir
	kindSymlink
)

// entry is one file, directory or symlink of a layer.
type entry struct {
	// path inside the image, relative to its root ("usr/bin/x").
	path string
	kind entryKind
	// mode holds the permission bits (and setuid/setgid/sticky).
	mode fs.FileMode
	// data is a file's content.
	data []byte
	// target is a symlink's target.
	target   string
	uid, gid int
}

// layerTar writes entries as an uncompressed layer tar and returns it with
// its digest (the config's diff ID). go-containerregistry compresses and
// describes layers but has no writer for a tree of entries with modes,
// owners and symlinks, so the tar is ours: sorted by path, every entry
// stamped with mtime. Parent directories that entries leave out are added
// as root-owned 0755 directories, so an unpacker never invents their modes.
// Two entries with the same path are an error: which one wins would depend
// on the order they were gathered in.
func layerTar(entries []entry, mtime time.Time) ([]byte, v1.Hash, error) {
	byPath := map[string]entry{}
	for _, e := range entries {
		p, err := cleanPath(e.path)
		if err != nil {
			return nil, v1.Hash{}, err
		}
		e.path = p
		if old, ok := byPath[p]; ok && !(old.kind == kindDir && e.kind == kindDir) {
			return nil, v1.Hash{}, fmt.Errorf("layer has %s twice", p)
		}
		byPath[p] = e
	}
	for p := range byPath {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = entry{path: d, kind: kindDir, mode: 0o755}
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
		h := &tar.Header{Name: p, Mode: tarMode(e.mode), Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		switch e.kind {
		case kindFile:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		case kindDir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case kindSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.target
		default:
			return nil, v1.Hash{}, fmt.Errorf("%s: unknown entry kind %d", p, e.kind)
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, v1.Hash{}, fmt.Errorf("writing %s: %w", p, err)
		}
		if e.kind == kindFile {
			if _, err := tw.Write(e.data); err != nil {
				return nil, v1.Hash{}, fmt.Errorf("writing %s: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, v1.Hash{}, err
	}
	diffID, _, err := v1.SHA256(bytes.NewReader(buf.Bytes()))
	return buf.Bytes(), diffID, err
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

// fileMode is the fs.FileMode of a tar header's mode: permissions and the
// setuid, setgid and sticky bits.
func fileMode(tarMode int64) fs.FileMode {
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
