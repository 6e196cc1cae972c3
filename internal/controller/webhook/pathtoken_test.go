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

package webhook

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	tokenA = "0123456789abcdef0123456789abcdef"
	tokenB = "fedcba9876543210fedcba9876543210"
)

// pathTokenAt is a PathToken whose clock the test moves.
func pathTokenAt(now *time.Time) *PathToken {
	return &PathToken{now: func() time.Time { return *now }}
}

// What each step of a controller's life accepts: the plain paths until it
// knows a token, and for a while after it wrote the first one; then only
// the token, or a token it gave up for a while.
func TestPathToken(t *testing.T) {
	type accepts struct{ Plain, A, B bool }
	check := func(t *testing.T, step string, tok *PathToken, want accepts) {
		t.Helper()
		got := accepts{tok.accepts(""), tok.accepts(tokenA), tok.accepts(tokenB)}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%s: accepted (-want +got):\n%s", step, diff)
		}
	}
	now := time.Unix(1e9, 0)

	t.Run("nobody keeps the configurations", func(t *testing.T) {
		check(t, "nil", nil, accepts{Plain: true})
		check(t, "nothing adopted yet", pathTokenAt(&now), accepts{Plain: true})
	})

	t.Run("the configurations carry a token", func(t *testing.T) {
		tok := pathTokenAt(&now)
		if got := tok.Adopt(tokenB); got != tokenB {
			t.Fatalf("Adopt(%s) = %s", tokenB, got)
		}
		check(t, "adopted", tok, accepts{B: true})
		if got := tok.Adopt(""); got != tokenB {
			t.Errorf("a configuration without a token gets %s, want %s", got, tokenB)
		}
		// Someone reset a configuration's paths: until API servers see
		// the token again, they use the plain paths.
		check(t, "reset", tok, accepts{Plain: true, B: true})
		if got := tok.Adopt("not-a-token"); got != tokenB {
			t.Errorf("a configuration with a malformed token gets %s, want %s", got, tokenB)
		}
		// Another replica wrote a smaller token: both converge on it,
		// and the one given up is accepted while API servers catch up.
		if got := tok.Adopt(tokenA); got != tokenA {
			t.Errorf("Adopt(smaller) = %s, want %s", got, tokenA)
		}
		check(t, "switched", tok, accepts{A: true, B: true})
		if got := tok.Adopt(tokenB); got != tokenA {
			t.Errorf("Adopt(larger) = %s, want to keep %s", got, tokenA)
		}
		later := now.Add(pathTokenGrace)
		tok.now = func() time.Time { return later }
		check(t, "after the grace", tok, accepts{A: true})
	})

	t.Run("the first token is this controller's", func(t *testing.T) {
		tok := pathTokenAt(&now)
		made := tok.Adopt("")
		if !IsPathToken(made) || made == tokenA || made == tokenB {
			t.Fatalf("made token %q", made)
		}
		if !tok.accepts(made) || !tok.accepts("") {
			t.Error("the new token and, while API servers catch up, the plain paths must be accepted")
		}
		if again := tok.Adopt(""); again != made {
			t.Errorf("a second Adopt made another token: %s, then %s", made, again)
		}
		later := now.Add(pathTokenGrace)
		tok.now = func() time.Time { return later }
		if tok.accepts("") {
			t.Error("the plain paths are still accepted after the grace")
		}
	})

	t.Run("two replicas that started together agree", func(t *testing.T) {
		r1, r2 := pathTokenAt(&now), pathTokenAt(&now)
		t1, t2 := r1.Adopt(""), r2.Adopt("")
		// Each then reads what the other wrote.
		a, b := r1.Adopt(t2), r2.Adopt(t1)
		if a != b || a != min(t1, t2) {
			t.Errorf("replicas hold %s and %s, want both %s", a, b, min(t1, t2))
		}
	})
}

func TestSplitPathToken(t *testing.T) {
	for path, want := range map[string][2]string{
		RewritePath:                      {RewritePath, ""},
		RewritePath + "/" + tokenA:       {RewritePath, tokenA},
		RewritePath + "/" + tokenA + "x": {RewritePath + "/" + tokenA + "x", ""},
		"/" + tokenA:                     {"", tokenA},
		strings.ToUpper(tokenA):          {strings.ToUpper(tokenA), ""},
		"":                               {"", ""},
	} {
		base, token := SplitPathToken(path)
		if diff := cmp.Diff(want, [2]string{base, token}); diff != "" {
			t.Errorf("SplitPathToken(%q) (-want +got):\n%s", path, diff)
		}
	}
}

// Every webhook is served on its path followed by the token, and a
// request without it is answered 404 before its body is read.
func TestMuxRequiresThePathToken(t *testing.T) {
	m, err := NewMetrics(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1e9, 0)
	tok := pathTokenAt(&now)
	tok.Adopt(tokenA)
	read := 0
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		read++
	})
	mux := NewMux(m, tok, h, h, h, h)
	type result struct {
		Path string
		Code int
	}
	var got, want []result
	for _, path := range []string{RewritePath, ValidatePath, ProfileWritesPath, PodPreferencePath} {
		for _, p := range []string{path, path + "/" + tokenA, path + "/" + tokenB, path + "/x/" + tokenA} {
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, httptest.NewRequest(http.MethodPost, p, strings.NewReader("{}")))
			got = append(got, result{p, w.Code})
			code := http.StatusNotFound
			if p == path+"/"+tokenA {
				code = http.StatusOK
			}
			want = append(want, result{p, code})
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
	if read != 4 {
		t.Errorf("%d bodies read, want the 4 of the requests that named the token", read)
	}
	if diff := cmp.Diff(map[string]float64{refusedToken: 8}, refusals(t, m)); diff != "" {
		t.Errorf("refusals (-want +got):\n%s", diff)
	}
}
