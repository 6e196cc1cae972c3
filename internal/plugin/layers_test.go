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

package plugin

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// layers are the plugin's files from the lowest layer up, as the package
// doc describes them: a file may use what its own layer and the layers
// below declare, never what a higher one does.
var layers = [][]string{
	// The node's GPUs and their taints, the guard, and what every part
	// uses: metrics, traces, crash points.
	{"crashpoint.go", "crashpoint_default.go", "crashpoint_faultinject.go", "gpus.go", "hardneed.go", "lock.go", "metrics.go", "socketpath.go", "trace.go", "unreadable.go"},
	// What a claim's devices may need: the sharing strategies, MIG
	// partitions, profiling.
	{"collections.go", "memoryshare.go", "mig.go", "mps.go", "profiling.go", "timeslice.go"},
	// The device state, and the pool of published slices beside it.
	{"prepare.go", "reconcile.go", "state.go", "usage.go", "featurecheck.go", "pool.go", "slicelayout.go", "slicewatch.go"},
	// Health, which republishes through the pool.
	{"health.go", "healthstatus.go"},
	// The adapter: the kubelet's calls, start and stop, the loops.
	{"driver.go", "kubelet.go", "probes.go", "stale.go", "startwait.go"},
}

// TestLayers: no file of the package uses a type, function, method,
// constant or variable that a file of a higher layer declares. A method is
// told by its name; one that types of several layers declare counts as the
// lowest's, and only unexported ones are told.
func TestLayers(t *testing.T) {
	layerOf := map[string]int{}
	for i, files := range layers {
		for _, f := range files {
			layerOf[f] = i
		}
	}
	fset := token.NewFileSet()
	files := map[string]*ast.File{}
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// doc.go declares nothing, so it is in no layer.
		if len(f.Decls) > 0 {
			files[name] = f
		}
	}
	var unplaced, stale []string
	for name := range files {
		if _, ok := layerOf[name]; !ok {
			unplaced = append(unplaced, name)
		}
	}
	for name := range layerOf {
		if _, ok := files[name]; !ok {
			stale = append(stale, name)
		}
	}
	if len(unplaced)+len(stale) > 0 {
		t.Fatalf("files not in a layer: %v; layers naming no file: %v", unplaced, stale)
	}

	// Where each package-level name and each method name is declared.
	declared, methods := map[string][]string{}, map[string][]string{}
	for name, f := range files {
		for _, decl := range f.Decls {
			switch decl := decl.(type) {
			case *ast.FuncDecl:
				if decl.Recv != nil {
					methods[decl.Name.Name] = append(methods[decl.Name.Name], name)
				} else {
					declared[decl.Name.Name] = append(declared[decl.Name.Name], name)
				}
			case *ast.GenDecl:
				for _, spec := range decl.Specs {
					switch spec := spec.(type) {
					case *ast.TypeSpec:
						declared[spec.Name.Name] = append(declared[spec.Name.Name], name)
					case *ast.ValueSpec:
						for _, n := range spec.Names {
							if n.Name != "_" {
								declared[n.Name] = append(declared[n.Name], name)
							}
						}
					}
				}
			}
		}
	}
	lowest := func(in []string) (string, int) {
		best, at := "", len(layers)
		for _, f := range in {
			if layerOf[f] < at {
				best, at = f, layerOf[f]
			}
		}
		return best, at
	}

	var upward []string
	for name, f := range files {
		seen := map[string]bool{}
		use := func(ident string, in []string) {
			to, at := lowest(in)
			if at > layerOf[name] && !seen[ident] {
				seen[ident] = true
				upward = append(upward, fmt.Sprintf("%s (layer %d) uses %s of %s (layer %d)", name, layerOf[name], ident, to, at))
			}
		}
		selectors, keys := map[*ast.Ident]bool{}, map[*ast.Ident]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.SelectorExpr:
				selectors[n.Sel] = true
				// An exported name may be another package's method (a
				// ticker's Stop); the plugin's exported methods are
				// Driver's, which a use of the type itself shows.
				if in, ok := methods[n.Sel.Name]; ok && !ast.IsExported(n.Sel.Name) {
					use(n.Sel.Name+"()", in)
				}
			case *ast.KeyValueExpr:
				// A struct literal's field names are not uses.
				if k, ok := n.Key.(*ast.Ident); ok {
					keys[k] = true
				}
			case *ast.Ident:
				// Obj is nil only where the file does not declare the name:
				// another file of the package, an import or the universe.
				if n.Obj == nil && !selectors[n] && !keys[n] {
					if in, ok := declared[n.Name]; ok {
						use(n.Name, in)
					}
				}
			}
			return true
		})
	}
	slices.Sort(upward)
	if diff := cmp.Diff([]string(nil), upward); diff != "" {
		t.Errorf("uses of a higher layer (-want +got):\n%s", diff)
	}
}
