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

package residency

import (
	"errors"
	"os"
	"reflect"
	"testing"
)

func TestExecutableMappings(t *testing.T) {
	maps, err := os.ReadFile("testdata/maps")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		exe  string
		want []mapping
	}{
		{"/usr/bin/prism-kubelet-plugin", []mapping{{0x400000, 0x1a2f000}, {0x1a2f000, 0x3100000}}},
		{"/opt/my tools/prism-kubelet-plugin", []mapping{{0x7f0000400000, 0x7f0000401000}}},
		{"/usr/bin/other", nil},
	} {
		if got := executableMappings(string(maps), tc.exe); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: mappings %x, want %x (read-only mappings of that file only)", tc.exe, got, tc.want)
		}
	}
}

// TestReleaseLowersResidentFile: the test binary's own start-up pages leave
// memory; what the test touches afterwards comes back on its own.
func TestReleaseLowersResidentFile(t *testing.T) {
	before, err := ReadMemory(0)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Release()
	if errors.Is(err, ErrUnsupported) {
		t.Skipf("this kernel cannot page out on request: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	after, err := ReadMemory(0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Mappings == 0 || res.Bytes == 0 {
		t.Errorf("released %+v: want the executable's read-only mappings", res)
	}
	if after.File >= before.File {
		t.Errorf("file-backed resident memory %d bytes after release, %d before: want less", after.File, before.File)
	}
	if before.Total < before.File+before.Anon || before.File == 0 || before.Anon == 0 {
		t.Errorf("resident memory %+v: VmRSS should hold RssFile and RssAnon, both non-zero", before)
	}
	t.Logf("file-backed resident memory %d KiB -> %d KiB", before.File>>10, after.File>>10)
}
