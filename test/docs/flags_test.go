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
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// helpFlag is a flag as pflag's usage lists it: "      --name type   help"
// or "  -v, --v Level   help".
var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-\w, )?--([a-z0-9-]+)`)

// docRow is a flags table row's first cell, where the docs name the flags
// the row documents; other cells may name other binaries' flags.
var docRow = regexp.MustCompile(`(?m)^\|([^|]*)\|`)

// docFlag is a flag as a first cell names it.
var docFlag = regexp.MustCompile("`--([a-z0-9-]+)`")

// TestEveryFlagIsDocumented: each flag a binary accepts is in
// docs/reference.md's "## Flags" section, under the binary's own heading
// or the shared logging table, and the docs list no flag that is gone.
func TestEveryFlagIsDocumented(t *testing.T) {
	flags := section(t, referenceDoc, readDoc(t, referenceDoc), "\n## Flags\n", "\n## ")
	shared := section(t, referenceDoc, flags, "\n### Logging flags (both binaries)\n", "\n### ")
	for _, binary := range []string{"prism-kubelet-plugin", "prism-controller"} {
		t.Run(binary, func(t *testing.T) {
			own := section(t, referenceDoc, flags, "\n### `"+binary+"`\n", "\n### ")
			documented := documentedFlags(own + shared)
			accepted := names(helpFlag, help(t, binary))
			for _, f := range accepted {
				if f != "help" && f != "version" && !slices.Contains(documented, f) {
					t.Errorf("%s accepts --%s, which %s does not list", binary, f, referenceDoc)
				}
			}
			for _, f := range documentedFlags(own) {
				if !slices.Contains(accepted, f) {
					t.Errorf("%s lists --%s under %s, which it does not accept", referenceDoc, f, binary)
				}
			}
		})
	}
}

// help builds the binary and returns its --help output.
func help(t *testing.T, binary string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), binary)
	build := exec.Command("go", "build", "-o", bin, "./cmd/"+binary)
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building %s: %v\n%s", binary, err, out)
	}
	// pflag prints the usage and exits 0 on --help.
	out, err := exec.Command(bin, "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("%s --help: %v\n%s", binary, err, out)
	}
	return string(out)
}

// documentedFlags are the flags the first cells of a section's tables name.
func documentedFlags(text string) []string {
	var cells []string
	for _, m := range docRow.FindAllStringSubmatch(text, -1) {
		cells = append(cells, m[1])
	}
	return names(docFlag, strings.Join(cells, "\n"))
}

func names(re *regexp.Regexp, text string) []string {
	var out []string
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		if !slices.Contains(out, m[1]) {
			out = append(out, m[1])
		}
	}
	slices.Sort(out)
	return out
}
