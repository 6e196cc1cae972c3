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
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// mdLink is a Markdown link or image: the target, before any title.
var mdLink = regexp.MustCompile(`!?\[[^\]]*\]\(([^)\s]+)[^)]*\)`)

// heading is an ATX heading outside code: its level marks and its text.
var heading = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// prose returns the lines of a Markdown file outside fenced code blocks,
// with their line numbers, where links and headings mean what they say.
func prose(text string) map[int]string {
	lines := map[int]string{}
	fenced := false
	for n, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			lines[n+1] = line
		}
	}
	return lines
}

// anchors are the fragment identifiers GitHub gives a file's headings:
// lower case, inline code marks and punctuation other than "-" and "_"
// dropped, spaces turned into "-", and a repeated one suffixed -1, -2, ...
func anchors(text string) []string {
	lines := prose(text)
	numbers := make([]int, 0, len(lines))
	for n := range lines {
		numbers = append(numbers, n)
	}
	slices.Sort(numbers)
	var out []string
	seen := map[string]int{}
	for _, n := range numbers {
		m := heading.FindStringSubmatch(lines[n])
		if m == nil {
			continue
		}
		slug := slugify(m[2])
		if k := seen[slug]; k > 0 {
			out = append(out, fmt.Sprintf("%s-%d", slug, k))
		} else {
			out = append(out, slug)
		}
		seen[slug]++
	}
	return out
}

func slugify(title string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlugify(t *testing.T) {
	for _, tc := range []struct{ title, want string }{
		{title: "`nvidia.com/gpu` requests", want: "nvidiacomgpu-requests"},
		{title: "Plugin pod stuck in `Init:0/1`", want: "plugin-pod-stuck-in-init01"},
		{title: "Metrics values (opt-in)", want: "metrics-values-opt-in"},
		{title: "Reading `prismctl explain claim`", want: "reading-prismctl-explain-claim"},
		{title: "Under the default chart: the path token", want: "under-the-default-chart-the-path-token"},
	} {
		if got := slugify(tc.title); got != tc.want {
			t.Errorf("slugify(%q) = %q, want %q", tc.title, got, tc.want)
		}
	}
}

// A link in a user doc that names no file, or no heading of it, sends the
// reader nowhere; a link outside the repository breaks in every clone.
func TestUserDocLinksResolve(t *testing.T) {
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, path := range userDocs(t) {
		rel, _ := filepath.Rel(repoRoot, path)
		text := readDoc(t, filepath.ToSlash(rel))
		for n, line := range prose(text) {
			for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				if err := resolve(root, path, target); err != nil {
					t.Errorf("%s:%d: link %s: %v", rel, n, target, err)
				}
			}
		}
	}
	if checked == 0 {
		t.Fatal("found no relative links in the user docs; the search is broken")
	}
}

// resolve checks that target, a link in the file at from, names a file or
// folder of the repository and, with a fragment, a heading of that file.
func resolve(root, from, target string) error {
	file, fragment, _ := strings.Cut(target, "#")
	if strings.HasPrefix(file, "/") {
		return fmt.Errorf("an absolute path: link relative to the file")
	}
	abs := from
	if file != "" {
		var err error
		abs, err = filepath.Abs(filepath.Join(filepath.Dir(from), filepath.FromSlash(file)))
		if err != nil {
			return err
		}
	}
	if abs != root && !strings.HasPrefix(abs, root+string(filepath.Separator)) {
		return fmt.Errorf("outside the repository")
	}
	info, err := os.Stat(abs)
	if err != nil {
		return fmt.Errorf("no such file or folder")
	}
	if fragment == "" {
		return nil
	}
	if info.IsDir() || !strings.HasSuffix(abs, ".md") {
		return fmt.Errorf("a fragment on a file that is not Markdown")
	}
	raw, err := os.ReadFile(abs)
	if err != nil {
		return err
	}
	if !slices.Contains(anchors(string(raw)), fragment) {
		return fmt.Errorf("no heading with anchor #%s", fragment)
	}
	return nil
}

// outsidePath is a path that exists on one machine only: the project's
// shared folder beside the checkout, or a path under a home or work folder.
var outsidePath = regexp.MustCompile(`(?:\.\./shared/|/work/|/home/|/root/)`)

// User docs ship with the repository, so what they point to must too.
func TestUserDocsPointInsideTheRepository(t *testing.T) {
	for _, path := range userDocs(t) {
		rel, _ := filepath.Rel(repoRoot, path)
		for n, line := range strings.Split(readDoc(t, filepath.ToSlash(rel)), "\n") {
			if m := outsidePath.FindString(line); m != "" {
				t.Errorf("%s:%d points outside the repository: %q", rel, n+1, m)
			}
		}
	}
}
