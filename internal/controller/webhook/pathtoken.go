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
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// PathToken authenticates the API server without anything the cluster
// must be configured for: the webhook configurations carry a secret as the
// last segment of each webhook's path, and the webhooks answer only
// requests that name it. Only who may read the configurations (cluster
// administrators; no tenant) and the API server, over TLS, learn it; a pod
// that reaches the port without it gets a 404 before its body is read.
//
// The controller that keeps the configurations' caBundle (self-signed
// mode) keeps their paths too: it adopts the token it finds there, or
// writes one of its own where there is none. Replicas converge on the
// smallest token any of them has seen, so that two that started together
// agree. Until a token is known, the plain paths are served, as they are
// where nobody keeps the configurations (certificates from cert-manager),
// and for pathTokenGrace after this controller wrote the first token.
type PathToken struct {
	mu      sync.Mutex
	current string
	// previous was current before ("" for the plain paths, where this
	// controller wrote the first token). It is accepted until
	// previousUntil: API servers pick up a configuration's change through
	// their informers, within seconds.
	previous      string
	previousUntil time.Time
	now           func() time.Time
}

// pathTokenGrace is how long a token that was replaced is still accepted.
const pathTokenGrace = 30 * time.Second

// pathTokenLen is the length of a token: 128 random bits in hex.
const pathTokenLen = 32

// NewPathToken returns a PathToken that knows no token yet.
func NewPathToken() *PathToken {
	return &PathToken{now: time.Now}
}

// Adopt takes the token found in a webhook configuration ("" for none,
// or one that is not well formed) and returns the token the
// configurations must carry.
func (t *PathToken) Adopt(found string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !IsPathToken(found) {
		found = ""
	}
	switch {
	case found != "" && t.current == "":
		// The configurations carry it already: the API server uses it.
		t.current = found
	case found != "" && found < t.current:
		t.previous, t.previousUntil, t.current = t.current, t.now().Add(pathTokenGrace), found
	case found == "":
		// The configurations are about to carry a path token: for the
		// first time, or again after someone reset their paths (kubectl
		// apply, or a renderer that cannot look the token up). Until API
		// servers see it they use the plain paths.
		if t.current == "" {
			t.current = newPathToken()
		}
		t.previous, t.previousUntil = "", t.now().Add(pathTokenGrace)
	}
	return t.current
}

// accepts says whether a request naming token (as its path's last
// segment; "" for a plain path) may be reviewed.
func (t *PathToken) accepts(token string) bool {
	if t == nil {
		return token == ""
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.current == "" {
		return token == ""
	}
	if subtle.ConstantTimeCompare([]byte(token), []byte(t.current)) == 1 {
		return true
	}
	return t.now().Before(t.previousUntil) && subtle.ConstantTimeCompare([]byte(token), []byte(t.previous)) == 1
}

// guard answers 404 to a request whose path does not name the token.
func (t *PathToken) guard(refused func(reason string), h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !t.accepts(r.PathValue("token")) {
			refused(refusedToken)
			klog.FromContext(r.Context()).V(2).Info("Refusing review without the path token", "remote", r.RemoteAddr)
			http.NotFound(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// IsPathToken says whether s has the form of a token.
func IsPathToken(s string) bool {
	if len(s) != pathTokenLen {
		return false
	}
	for _, c := range []byte(s) {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// Split is SplitPathToken.
func (*PathToken) Split(path string) (base, token string) { return SplitPathToken(path) }

// SplitPathToken splits a webhook path into the path the webhook is
// served on and the token its last segment carries ("" for none).
func SplitPathToken(path string) (base, token string) {
	i := strings.LastIndexByte(path, '/')
	if i < 0 || !IsPathToken(path[i+1:]) {
		return path, ""
	}
	return path[:i], path[i+1:]
}

func newPathToken() string {
	b := make([]byte, pathTokenLen/2)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}
