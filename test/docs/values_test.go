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
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// docValue is a value as a values table's first cell names it: in full
// (`controller.replicas`) or, after a full one, by the last part of its
// name under the same parent (`.name` after `controller.serviceAccount.create`).
var docValue = regexp.MustCompile("`(\\.?[a-zA-Z][a-zA-Z0-9]*(?:\\.[a-zA-Z][a-zA-Z0-9]*)*)`")

// documentedValues are the values the first cells of text's tables name.
func documentedValues(text string) []string {
	var out []string
	for _, m := range docRow.FindAllStringSubmatch(text, -1) {
		parent := ""
		for _, v := range docValue.FindAllStringSubmatch(m[1], -1) {
			name := v[1]
			if strings.HasPrefix(name, ".") {
				name = parent + name
			} else if i := strings.LastIndex(name, "."); i > 0 {
				parent = name[:i]
			}
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func TestDocumentedValues(t *testing.T) {
	text := "| `image.tag` | x |\n" +
		"| `kubeletPlugin.serviceAccount.create`, `.name`, `.annotations` | `true` |\n" +
		"| `imagePullSecrets` | `[]` |\n"
	want := []string{"image.tag", "imagePullSecrets", "kubeletPlugin.serviceAccount.annotations", "kubeletPlugin.serviceAccount.create", "kubeletPlugin.serviceAccount.name"}
	if diff := cmp.Diff(want, documentedValues(text)); diff != "" {
		t.Errorf("documentedValues (-want +got):\n%s", diff)
	}
}

// TestEveryChartValueIsDocumented: every value of the chart's values.yaml
// is in docs/reference.md's "## Helm values" section, with when to change
// it, and the section names no value the chart does not have. A map is
// documented whole (`kubeletPlugin.resources`) or key by key.
func TestEveryChartValueIsDocumented(t *testing.T) {
	var values map[string]any
	if err := yaml.Unmarshal([]byte(readDoc(t, "deployments/helm/prism/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	documented := documentedValues(section(t, referenceDoc, readDoc(t, referenceDoc), "\n## Helm values\n", "\n## "))
	var walk func(path string, v any)
	walk = func(path string, v any) {
		if slices.Contains(documented, path) {
			return
		}
		m, ok := v.(map[string]any)
		if !ok || len(m) == 0 {
			t.Errorf("the chart has value %s, which %s does not list", path, referenceDoc)
			return
		}
		for k, sub := range m {
			walk(path+"."+k, sub)
		}
	}
	for k, v := range values {
		walk(k, v)
	}
	for _, name := range documented {
		if !hasValue(values, name) {
			t.Errorf("%s lists value %s, which the chart does not have", referenceDoc, name)
		}
	}
}

// hasValue says whether values holds the dotted path name.
func hasValue(values map[string]any, name string) bool {
	var v any = values
	for _, key := range strings.Split(name, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return false
		}
		if v, ok = m[key]; !ok {
			return false
		}
	}
	return true
}
