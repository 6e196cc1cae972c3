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

// Package docs checks that the operator documentation names what the code
// does.
package docs

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

// emittedReasons are the Event reasons under pkg/ and internal/: string literals passed
// as the reason of an Eventf or Event call, and constants named
// EventReason* (for calls that pass the reason in a variable).
func emittedReasons(t *testing.T) []string {
	t.Helper()
	var reasons []string
	fset := token.NewFileSet()
	walk := func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok || (sel.Sel.Name != "Eventf" && sel.Sel.Name != "Event") || len(n.Args) < 3 {
					return true
				}
				if lit, ok := n.Args[2].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					reason, _ := strconv.Unquote(lit.Value)
					reasons = append(reasons, reason)
				}
			case *ast.ValueSpec:
				for i, name := range n.Names {
					if !strings.HasPrefix(name.Name, "EventReason") || i >= len(n.Values) {
						continue
					}
					if lit, ok := n.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						reason, _ := strconv.Unquote(lit.Value)
						reasons = append(reasons, reason)
					}
				}
			}
			return true
		})
		return nil
	}
	for _, dir := range []string{"pkg", "internal"} {
		if err := filepath.WalkDir(filepath.Join(repoRoot, dir), walk); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(reasons)
	return slices.Compact(reasons)
}

// documentedReasons are the first-column entries of the table in the
// "## Events" section of docs/reference.md.
func documentedReasons(t *testing.T) []string {
	t.Helper()
	events := section(t, referenceDoc, readDoc(t, referenceDoc), "\n## Events\n", "\n## ")
	row := regexp.MustCompile("(?m)^\\| `([A-Za-z]+)` \\|")
	var reasons []string
	for _, m := range row.FindAllStringSubmatch(events, -1) {
		reasons = append(reasons, m[1])
	}
	slices.Sort(reasons)
	return reasons
}

// An operator looks up what kubectl describe shows in this table; a reason
// missing from it, or one the code no longer emits, sends them nowhere.
func TestEventsTableMatchesTheCode(t *testing.T) {
	emitted, documented := emittedReasons(t), documentedReasons(t)
	if len(emitted) == 0 {
		t.Fatal("found no Event reasons under pkg/ or internal/; the search is broken")
	}
	for _, r := range emitted {
		if !slices.Contains(documented, r) {
			t.Errorf("the code emits Event reason %s, which %s does not list", r, referenceDoc)
		}
	}
	for _, r := range documented {
		if !slices.Contains(emitted, r) {
			t.Errorf("%s lists Event reason %s, which no code emits", referenceDoc, r)
		}
	}
}
