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

package nvml

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"
)

// sysFS is the sysfs tree of a simulated node, in memory: regular files
// and symbolic links by slash-separated path, with the directories between
// them implied. Open follows links as the kernel does, so
// fs.ReadFile(sysfs, "bus/pci/devices/0000:07:00.0/numa_node") reads
// through the device's link, while ReadLink and Lstat see the link itself.
// It stands where a real node has os.DirFS("/sys"); testing/fstest's MapFS
// would do the same, but it would put a test package into the binaries.
type sysFS map[string]sysNode

// sysNode is a regular file, or a symbolic link when link is set. A link's
// target is relative to the link's directory, as sysfs writes them.
type sysNode struct {
	data []byte
	link string
}

var _ fs.ReadLinkFS = sysFS(nil)

// maxLinkHops is how many links one lookup follows before it gives up, as
// Linux's ELOOP limit.
const maxLinkHops = 40

var errLinkLoop = errors.New("too many levels of symbolic links")

func (s sysFS) addFile(name string, data []byte) { s[name] = sysNode{data: data} }

func (s sysFS) addLink(name, target string) { s[name] = sysNode{link: target} }

// Open opens the named file or directory, following links.
func (s sysFS) Open(name string) (fs.File, error) {
	resolved, info, err := s.lookup("open", name, true)
	if err != nil {
		return nil, err
	}
	if info.IsDir() {
		return &sysDir{path: name, info: info, entries: s.list(resolved)}, nil
	}
	return &sysFile{Reader: bytes.NewReader(s[resolved].data), info: info}, nil
}

// ReadLink returns the target of the named link.
func (s sysFS) ReadLink(name string) (string, error) {
	resolved, info, err := s.lookup("readlink", name, false)
	if err != nil {
		return "", err
	}
	if info.mode.Type() != fs.ModeSymlink {
		return "", &fs.PathError{Op: "readlink", Path: name, Err: fs.ErrInvalid}
	}
	return s[resolved].link, nil
}

// Lstat describes the named file without following it if it is a link.
func (s sysFS) Lstat(name string) (fs.FileInfo, error) {
	_, info, err := s.lookup("lstat", name, false)
	if err != nil {
		return nil, err
	}
	return info, nil
}

// lookup resolves name, following a link at its end where followLast, and
// describes what it names under name's own base name; its errors are
// PathErrors of op.
func (s sysFS) lookup(op, name string, followLast bool) (string, sysInfo, error) {
	resolved, err := s.resolve(name, followLast)
	if err != nil {
		return "", sysInfo{}, &fs.PathError{Op: op, Path: name, Err: err}
	}
	info, ok := s.stat(resolved)
	if !ok {
		return "", sysInfo{}, &fs.PathError{Op: op, Path: name, Err: fs.ErrNotExist}
	}
	info.name = path.Base(name)
	return resolved, info, nil
}

// resolve returns name with each link along it replaced by its target; the
// last element is followed only if followLast is set. A link that leaves
// the tree leads nowhere.
func (s sysFS) resolve(name string, followLast bool) (string, error) {
	if !fs.ValidPath(name) {
		return "", fs.ErrInvalid
	}
	resolved, rest, hops := ".", name, 0
	for rest != "." && rest != "" {
		elem, tail, _ := strings.Cut(rest, "/")
		next := path.Join(resolved, elem)
		if n := s[next]; n.link != "" && (tail != "" || followLast) {
			if hops++; hops > maxLinkHops {
				return "", errLinkLoop
			}
			target := path.Join(resolved, n.link)
			if path.IsAbs(n.link) || !fs.ValidPath(target) {
				return "", fs.ErrNotExist
			}
			resolved, rest = ".", path.Join(target, tail)
			continue
		}
		resolved, rest = next, tail
	}
	return resolved, nil
}

// stat describes the entry at a resolved path: a file, a link, or a
// directory that some entry lies under.
func (s sysFS) stat(name string) (sysInfo, bool) {
	info := sysInfo{name: path.Base(name)}
	if n, ok := s[name]; ok {
		if n.link != "" {
			info.size, info.mode = int64(len(n.link)), fs.ModeSymlink|0o777
		} else {
			info.size, info.mode = int64(len(n.data)), 0o444
		}
		return info, true
	}
	info.mode = fs.ModeDir | 0o555
	if name == "." {
		return info, true
	}
	for key := range s {
		if strings.HasPrefix(key, name+"/") {
			return info, true
		}
	}
	return sysInfo{}, false
}

// list returns the entries of a resolved directory, sorted by name.
func (s sysFS) list(dir string) []fs.DirEntry {
	prefix := dir + "/"
	if dir == "." {
		prefix = ""
	}
	seen := map[string]bool{}
	var entries []fs.DirEntry
	for key := range s {
		rest, ok := strings.CutPrefix(key, prefix)
		if !ok {
			continue
		}
		elem, _, _ := strings.Cut(rest, "/")
		if seen[elem] {
			continue
		}
		seen[elem] = true
		info, _ := s.stat(prefix + elem)
		entries = append(entries, fs.FileInfoToDirEntry(info))
	}
	slices.SortFunc(entries, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return entries
}

type sysInfo struct {
	name string
	size int64
	mode fs.FileMode
}

func (i sysInfo) Name() string       { return i.name }
func (i sysInfo) Size() int64        { return i.size }
func (i sysInfo) Mode() fs.FileMode  { return i.mode }
func (i sysInfo) ModTime() time.Time { return time.Time{} }
func (i sysInfo) IsDir() bool        { return i.mode.IsDir() }
func (i sysInfo) Sys() any           { return nil }

// sysFile is an open regular file.
type sysFile struct {
	*bytes.Reader
	info sysInfo
}

func (f *sysFile) Stat() (fs.FileInfo, error) { return f.info, nil }
func (f *sysFile) Close() error               { return nil }

// sysDir is an open directory; ReadDir hands out its entries in turn.
type sysDir struct {
	path    string
	info    sysInfo
	entries []fs.DirEntry
}

func (d *sysDir) Stat() (fs.FileInfo, error) { return d.info, nil }
func (d *sysDir) Close() error               { return nil }

func (d *sysDir) Read([]byte) (int, error) {
	return 0, &fs.PathError{Op: "read", Path: d.path, Err: fs.ErrInvalid}
}

func (d *sysDir) ReadDir(n int) ([]fs.DirEntry, error) {
	if n <= 0 {
		entries := d.entries
		d.entries = nil
		return entries, nil
	}
	if len(d.entries) == 0 {
		return nil, io.EOF
	}
	n = min(n, len(d.entries))
	entries := d.entries[:n]
	d.entries = d.entries[n:]
	return entries, nil
}
