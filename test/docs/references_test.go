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
	"regexp"
	"slices"
	"strings"
	"testing"
)

// userDocs are the documents an operator or a user reads: the README, the
// chart's README and docs/*.md. docs/design/ and test/bench/results/ hold
// the reasoning and the dated measurements, and are not among them.
func userDocs(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("found no docs/*.md; the search is broken")
	}
	return append(docs,
		filepath.Join(repoRoot, "README.md"),
		filepath.Join(repoRoot, "deployments", "helm", "prism", "README.md"))
}

// trackerReference matches a reference to an issue or pull request:
// "issue 18", "Issue-17", "issues #5", "PR 12", "#123" on its own, and
// "owner/repo#123" or a GitHub /issues/ or /pull/ address. A "#" that
// follows a word character, "&" or "/" is an anchor, an HTML entity or a
// path ("rewrite.md#cost", "&#123;"), not a reference.
var trackerReference = regexp.MustCompile(`(?i)\bissues? ?[-#]? ?[0-9]+\b|\b(?:PR|pull request) ?#?[0-9]+\b|(?:^|[^\w&/])#[0-9]+\b|[\w.-]+/[\w.-]+#[0-9]+\b|/(?:issues|pull)/[0-9]+\b`)

// hexRun is a maximal run of lower-case hex digits; commitHash says which
// of them read as an abbreviated or full commit.
var hexRun = regexp.MustCompile(`[0-9a-f]+`)

// commitHash: 7 to 40 hex digits with at least one digit and one letter,
// standing alone: after the start of the line, a space, a backtick, an
// opening parenthesis or bracket, or an en or em dash ("5bd112f–2db1574"),
// and before the end, a space, a backtick, a closing parenthesis or
// bracket, punctuation or such a dash. So a sha256 digest (64 digits) does
// not match, nor a CSS colour (after "#"), a UUID or a Go pseudo-version
// (their groups touch "-"), a PCI address or a number (no letter), a hex
// word without a digit ("deadbeef"), or hex inside a word or a path.
func commitHash(line string, start, end int) bool {
	h := line[start:end]
	if len(h) < 7 || len(h) > 40 || !strings.ContainsAny(h, "0123456789") || !strings.ContainsAny(h, "abcdef") {
		return false
	}
	before, after := line[:start], line[end:]
	return (before == "" || strings.ContainsAny(lastRune(before), " \t`([–—")) &&
		(after == "" || strings.ContainsAny(firstRune(after), " \t`)].,;:'\"–—"))
}

func lastRune(s string) string {
	r := []rune(s)
	return string(r[len(r)-1])
}

func firstRune(s string) string {
	return string([]rune(s)[0])
}

// offences returns every issue reference and commit hash in line.
func offences(line string) []string {
	var out []string
	for _, m := range trackerReference.FindAllString(line, -1) {
		out = append(out, strings.TrimSpace(m))
	}
	for _, m := range hexRun.FindAllStringIndex(line, -1) {
		if commitHash(line, m[0], m[1]) {
			out = append(out, line[m[0]:m[1]])
		}
	}
	return out
}

// The patterns flag what lab notebooks write and leave alone what user docs
// legitimately show.
func TestOffencesPatterns(t *testing.T) {
	for _, tc := range []struct {
		text string
		want []string
	}{
		{text: "### Targets of issue 18 on the stock scheduler", want: []string{"issue 18"}},
		{text: "Issue 13's acceptance", want: []string{"Issue 13"}},
		{text: "see issue-17, part 3", want: []string{"issue-17"}},
		{text: "fixed in #123.", want: []string{"#123"}},
		{text: "(#42)", want: []string{"(#42"}},
		{text: "upstream under kubernetes/kubernetes#131730.", want: []string{"kubernetes/kubernetes#131730"}},
		{text: "https://github.com/prismgpu/prism/pull/7", want: []string{"/pull/7"}},
		{text: "2026-11-25 at `ab67fb6`, 500 nodes", want: []string{"ab67fb6"}},
		{text: "commits 5bd112f–2db1574, the 2-core VM", want: []string{"5bd112f", "2db1574"}},
		{text: "(binaries of commit fdedf11), one", want: []string{"fdedf11"}},
		{text: "commit `41f8851b5f6760fd9e82867462edd3477f9268de` (2019-08-29", want: []string{"41f8851b5f6760fd9e82867462edd3477f9268de"}},
		{text: "a run of 83aa87b (all but the last change)", want: []string{"83aa87b"}},

		{text: "[the cost](rewrite.md#cost) and [Using it](#using-it)"},
		{text: "## Heading"},
		{text: "&#123; is an entity"},
		{text: "uid 3f2a1b4c-9d8e-4f7a-b6c5-1e2d3f4a5b6c"},
		{text: "sha256 `e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855`"},
		{text: "colour #a1b2c3d and #ffcc00"},
		{text: "PCI `00000000:3b:00.0`, 1000000 bytes"},
		{text: "deadbeef and cafebabe are words"},
		{text: "NVIDIA H100 80GB HBM3, 139Gi, 10.0, L40S"},
		{text: "v0.0.0-20240101120000-abcdef123456"},
		{text: "the 2-core VM, 2026-11-25 08:56 UTC"},
	} {
		if diff := slices.Compare(tc.want, offences(tc.text)); diff != 0 {
			t.Errorf("offences(%q) = %q, want %q", tc.text, offences(tc.text), tc.want)
		}
	}
}

// A user doc says what a thing does and how to use it. Which issue asked
// for it and which commit measured it belong in docs/design/, in dated
// files under test/bench/results/, or in git.
func TestUserDocsNameNoIssueOrCommit(t *testing.T) {
	for _, path := range userDocs(t) {
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(repoRoot, path)
		for n, line := range strings.Split(string(raw), "\n") {
			for _, o := range offences(line) {
				t.Errorf("%s:%d names an issue or a commit: %q", rel, n+1, o)
			}
		}
	}
}
