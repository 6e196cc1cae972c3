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

package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// referenceDoc is where an operator looks up every knob and everything
// Prism reports: flags, chart values, metrics, Events.
const referenceDoc = "docs/reference.md"

// readDoc returns the file at rel, a path from the repository's root.
func readDoc(t *testing.T, rel string) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(raw)
}

// section returns the text of doc from start to the next end, failing when
// start is missing.
func section(t *testing.T, doc, text, start, end string) string {
	t.Helper()
	_, after, ok := strings.Cut(text, start)
	if !ok {
		t.Fatalf("%s has no %q section", doc, strings.TrimSpace(start))
	}
	body, _, _ := strings.Cut(after, end)
	return body
}
