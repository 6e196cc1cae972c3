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
	"io"
	"io/fs"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var epoch = time.Unix(1700000000, 0).UTC()

func TestLayerTar(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []entry
		// want lists the tar's entries in order: name, mode, mtime and
		// owner; empty with wantErr.
		want    []string
		wantErr bool
	}{
		{
			name: "sorted, parents added",
			entries: []entry{
				{path: "usr/bin/b", kind: kindFile, mode: 0o755, data: []byte("b")},
				{path: "/etc/passwd", kind: kindFile, mode: 0o644, data: []byte("root")},
				{path: "bin/sh", kind: kindSymlink, target: "busybox"},
			},
			want: []string{
				"bin/ 0755 1700000000 0:0", "bin/sh 0000 1700000000 0:0", "etc/ 0755 1700000000 0:0", "etc/passwd 0644 1700000000 0:0",
				"usr/ 0755 1700000000 0:0", "usr/bin/ 0755 1700000000 0:0", "usr/bin/b 0755 1700000000 0:0",
			},
		},
		{
			name: "a directory given twice is one; sticky bit and owner kept",
			entries: []entry{
				{path: "tmp", kind: kindDir, mode: 0o777 | fs.ModeSticky},
				{path: "tmp/", kind: kindDir, mode: 0o777 | fs.ModeSticky},
				{path: "home/nonroot", kind: kindDir, mode: 0o700, uid: 65532, gid: 65532},
			},
			want: []string{"home/ 0755 1700000000 0:0", "home/nonroot/ 0700 1700000000 65532:65532", "tmp/ 1777 1700000000 0:0"},
		},
		{
			name:    "a file given twice",
			entries: []entry{{path: "a", kind: kindFile}, {path: "/a", kind: kindFile}},
			wantErr: true,
		},
		{
			name:    "outside the root",
			entries: []entry{{path: "../etc/passwd", kind: kindFile}},
			wantErr: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw, _, err := layerTar(tc.entries, epoch)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("layerTar succeeded, want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			err = EachTarEntry(bytes.NewReader(raw), func(h *tar.Header, _ io.Reader) error {
				got = append(got, fmt.Sprintf("%s %04o %d %d:%d", h.Name, h.Mode, h.ModTime.Unix(), h.Uid, h.Gid))
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("layer entries (-want +got):\n%s", diff)
			}
		})
	}
}

// The diff ID depends on the entries, not on the order they were gathered
// in; a changed byte changes it.
func TestLayerTarDiffID(t *testing.T) {
	x := entry{path: "x", kind: kindFile, data: []byte("1")}
	z := entry{path: "y/z", kind: kindFile, data: []byte("2")}
	changed := z
	changed.data = []byte("3")
	diffID := func(entries ...entry) string {
		_, d, err := layerTar(entries, epoch)
		if err != nil {
			t.Fatal(err)
		}
		return d.String()
	}
	for _, tc := range []struct {
		name     string
		a, b     []entry
		wantSame bool
	}{
		{"same entries in another order", []entry{x, z}, []entry{z, x}, true},
		{"a changed file", []entry{x, z}, []entry{x, changed}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := diffID(tc.a...), diffID(tc.b...)
			if diff := cmp.Diff(a, b); (diff == "") != tc.wantSame {
				t.Errorf("diff IDs equal: %v, want %v (-first +second):\n%s", diff == "", tc.wantSame, diff)
			}
		})
	}
}
