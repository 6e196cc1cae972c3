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
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// deb is a downloaded Debian package.
type deb struct {
	name, version, arch, file string
}

// debArch is Debian's name of a platform's architecture.
func debArch(p v1.Platform) (string, error) {
	switch p.Architecture {
	case "amd64", "arm64", "s390x":
		return p.Architecture, nil
	case "ppc64le":
		return "ppc64el", nil
	}
	return "", fmt.Errorf("no Debian architecture known for %s", p)
}

// debLayer is a layer of the files of Debian packages that keep accepts.
func (b *builder) debLayer(p v1.Platform, what string, keep func(path string) bool, pkgs ...string) layerSpec {
	return layerSpec{
		createdBy: "debian: " + what + " (" + strings.Join(pkgs, " ") + ")",
		entries: func(ctx context.Context) ([]entry, error) {
			arch, err := debArch(p)
			if err != nil {
				return nil, err
			}
			var entries []entry
			for _, name := range pkgs {
				d, err := b.fetchDeb(ctx, name, arch)
				if err != nil {
					return nil, err
				}
				es, err := debEntries(ctx, d.file, keep)
				if err != nil {
					return nil, fmt.Errorf("unpacking %s: %w", d.file, err)
				}
				entries = append(entries, es...)
				b.packages[name+":"+arch+"="+d.version] = true
			}
			return entries, nil
		},
	}
}

// fetchDeb downloads the candidate version of a package once into the
// cache, under its name, version and architecture. When apt's lists are
// missing or stale (a fresh machine, a mirror past a point release) and the
// builder runs as root, it refreshes them once and tries again.
func (b *builder) fetchDeb(ctx context.Context, name, arch string) (deb, error) {
	key := name + ":" + arch
	if d, ok := b.debs[key]; ok {
		return d, nil
	}
	d, err := b.downloadDeb(ctx, name, arch)
	if err != nil && !b.aptUpdated && os.Geteuid() == 0 {
		b.aptUpdated = true
		b.log("%v; running apt-get update", err)
		if out, uerr := exec.CommandContext(ctx, "apt-get", "update").CombinedOutput(); uerr != nil {
			return deb{}, fmt.Errorf("%w; apt-get update: %v\n%s", err, uerr, out)
		}
		d, err = b.downloadDeb(ctx, name, arch)
	}
	if err != nil {
		return deb{}, err
	}
	b.debs[key] = d
	return d, nil
}

func (b *builder) downloadDeb(ctx context.Context, name, arch string) (deb, error) {
	key := name + ":" + arch
	version, err := candidate(ctx, key)
	if err != nil {
		return deb{}, err
	}
	dir, err := b.dir("debs")
	if err != nil {
		return deb{}, err
	}
	d := deb{name: name, version: version, arch: arch,
		file: filepath.Join(dir, fmt.Sprintf("%s_%s_%s.deb", name, strings.ReplaceAll(version, ":", "%3a"), arch))}
	if _, err := os.Stat(d.file); err == nil {
		return d, nil
	}
	tmp, err := os.MkdirTemp(dir, ".download-")
	if err != nil {
		return deb{}, err
	}
	defer os.RemoveAll(tmp)
	// apt's sandbox user may not write here; downloading as the caller is
	// fine for a file only unpacked, never installed.
	cmd := exec.CommandContext(ctx, "apt-get", "download", "-o", "APT::Sandbox::User=root", key+"="+version)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return deb{}, fmt.Errorf("apt-get download %s=%s: %w\n%s", key, version, err, out)
	}
	files, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(files) != 1 {
		return deb{}, fmt.Errorf("apt-get download %s=%s left %d .deb files", key, version, len(files))
	}
	if err := os.Rename(files[0], d.file); err != nil {
		return deb{}, err
	}
	b.log("%s: downloaded %s", key, version)
	return d, nil
}

// candidate is the version apt would install, e.g. 2.36-9+deb12u14.
func candidate(ctx context.Context, pkg string) (string, error) {
	out, err := exec.CommandContext(ctx, "apt-cache", "policy", pkg).Output()
	if err != nil {
		return "", fmt.Errorf("apt-cache policy %s: %w", pkg, err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "Candidate:"); ok {
			if v = strings.TrimSpace(v); v != "" && v != "(none)" {
				return v, nil
			}
		}
	}
	hint := "apt-get update"
	if arch := pkg[strings.IndexByte(pkg, ':')+1:]; !strings.Contains(nativeArchs(ctx), arch) {
		hint = "dpkg --add-architecture " + arch + " && apt-get update"
	}
	return "", fmt.Errorf("apt knows no version of %s; run: %s", pkg, hint)
}

func nativeArchs(ctx context.Context) string {
	native, _ := exec.CommandContext(ctx, "dpkg", "--print-architecture").Output()
	foreign, _ := exec.CommandContext(ctx, "dpkg", "--print-foreign-architectures").Output()
	return string(native) + " " + string(foreign)
}

// debEntries reads a package's files (dpkg-deb --fsys-tarfile) that keep
// accepts, as root-owned layer entries; a hard link becomes a copy.
func debEntries(ctx context.Context, file string, keep func(string) bool) ([]entry, error) {
	out, err := exec.CommandContext(ctx, "dpkg-deb", "--fsys-tarfile", file).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile: %w", err)
	}
	var entries []entry
	data := map[string][]byte{}
	err = EachTarEntry(bytes.NewReader(out), func(h *tar.Header, content io.Reader) error {
		p := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if p == "." || !keep(p) {
			return nil
		}
		e := entry{path: p, mode: fileMode(h.Mode)}
		switch h.Typeflag {
		case tar.TypeDir:
			e.kind = kindDir
		case tar.TypeReg:
			e.kind = kindFile
			var err error
			if e.data, err = io.ReadAll(content); err != nil {
				return err
			}
			data[p] = e.data
		case tar.TypeSymlink:
			e.kind, e.target = kindSymlink, h.Linkname
		case tar.TypeLink:
			target := path.Clean(strings.TrimPrefix(h.Linkname, "./"))
			d, ok := data[target]
			if !ok {
				return fmt.Errorf("hard link to %s, which comes later or is left out", target)
			}
			e.kind, e.data = kindFile, d
		default:
			return fmt.Errorf("unsupported entry type %q", h.Typeflag)
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return entries, nil
}

func hasDirPrefix(p, dir string) bool { return strings.HasPrefix(p, dir+"/") }

func containsDir(p, name string) bool {
	for _, part := range strings.Split(p, "/") {
		if part == name {
			return true
		}
	}
	return false
}
