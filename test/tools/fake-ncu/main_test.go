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

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestDefaultReportIsTheFixture: the report fake-ncu prints by default is
// pkg/ncu's vectoradd_raw.csv, byte for byte, so that tests which compare
// a status with that file's figures hold for either.
func TestDefaultReportIsTheFixture(t *testing.T) {
	fixture, err := os.ReadFile(filepath.Join("..", "..", "..", "pkg", "ncu", "testdata", "vectoradd_raw.csv"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(defaultReport, fixture) {
		t.Errorf("test/tools/fake-ncu/vectoradd_raw.csv (%d bytes) differs from pkg/ncu/testdata/vectoradd_raw.csv (%d bytes); copy the latter over the former", len(defaultReport), len(fixture))
	}
}
