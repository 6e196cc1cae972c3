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

package rewrite

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The package's functions stay short enough to read in one go: at most
// maxFunctionLines lines and a cyclomatic complexity of maxComplexity,
// counted as gocyclo counts it. Rewrite once grew to 200 lines and a
// complexity of 75; its steps are functions of their own now. Test files
// are left out: their tables are data.
const (
	maxFunctionLines = 80
	maxComplexity    = 25
)

func TestFunctionsStayReadable(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	checked := 0
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			checked++
			at := fset.Position(fn.Pos())
			if lines := fset.Position(fn.End()).Line - at.Line + 1; lines > maxFunctionLines {
				t.Errorf("%s: %s is %d lines, more than %d: split it into steps", at, fn.Name.Name, lines, maxFunctionLines)
			}
			if c := complexity(fn); c > maxComplexity {
				t.Errorf("%s: %s has a cyclomatic complexity of %d, more than %d: split it into steps", at, fn.Name.Name, c, maxComplexity)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no function found to check")
	}
}

// complexity is gocyclo's count: one, plus one for each if, for, range,
// case and select case other than default, && and ||, function literals
// included.
func complexity(fn *ast.FuncDecl) int {
	c := 1
	ast.Inspect(fn, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.IfStmt, *ast.ForStmt, *ast.RangeStmt:
			c++
		case *ast.CaseClause:
			if n.List != nil {
				c++
			}
		case *ast.CommClause:
			if n.Comm != nil {
				c++
			}
		case *ast.BinaryExpr:
			if n.Op == token.LAND || n.Op == token.LOR {
				c++
			}
		}
		return true
	})
	return c
}

func TestComplexity(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       int
	}{
		{"straight", `x := 1; _ = x`, 1},
		{"a condition of two", `if a && b || c { return }`, 4},
		{"a switch with a default", `switch { case a: case b, c: default: }`, 3},
		{"loops", `for i := 0; i < 3; i++ {}; for range xs { if a {} }`, 4},
		{"a select with a default", `select { case <-ch: default: }`, 2},
		{"a function literal", `f := func() { if a {} }; f()`, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parser.ParseFile(token.NewFileSet(), "x.go", "package x\nfunc f() {"+tc.body+"}", 0)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, complexity(f.Decls[0].(*ast.FuncDecl))); diff != "" {
				t.Errorf("complexity (-want +got):\n%s", diff)
			}
		})
	}
}
