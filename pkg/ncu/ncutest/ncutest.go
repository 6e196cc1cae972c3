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

// Package ncutest shares the ncu captures under pkg/ncu/testdata with the
// tests of the packages that read them. Only tests import it.
package ncutest

import (
	"os"
	"path/filepath"
	"testing"
)

// AddFixtures seeds f with every capture under dir, the relative path from
// the calling test's package to pkg/ncu/testdata, so that fuzzing starts
// from reports ncu really writes.
func AddFixtures(f *testing.F, dir string) {
	f.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.csv"))
	if err != nil {
		f.Fatal(err)
	}
	if len(files) == 0 {
		f.Fatalf("no ncu captures under %s", dir)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}
