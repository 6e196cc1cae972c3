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

package localserve

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// bufferedContext is a test context whose log lines can be read back.
func bufferedContext(t *testing.T) (context.Context, func() string) {
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	t.Cleanup(cancel)
	return ctx, func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
}

// TestListen: a free address binds at once and quietly; one held by another
// listener is waited for, said once, and bound once released; a held one
// that is never released gives up when the context ends; an address that
// cannot be bound for another reason fails without waiting.
func TestListen(t *testing.T) {
	for _, tc := range []struct {
		name string
		// hold binds the address first and releases it after release
		// (never when negative).
		hold    bool
		release time.Duration
		addr    string
		timeout time.Duration
		wantErr string
		// wantWaiting: how often the in-use line and the bound line appear.
		wantWaiting, wantBound int
	}{
		{name: "free", wantWaiting: 0, wantBound: 0},
		{name: "held then freed", hold: true, release: 300 * time.Millisecond, wantWaiting: 1, wantBound: 1},
		{name: "held for good", hold: true, release: -1, timeout: 300 * time.Millisecond, wantErr: "gave up waiting", wantWaiting: 1},
		{name: "not an address", addr: "127.0.0.1:notaport", wantErr: "listen on 127.0.0.1:notaport"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, logs := bufferedContext(t)
			addr := tc.addr
			if addr == "" {
				// A port of our own, freed so that the case decides who holds it.
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addr = l.Addr().String()
				if err := l.Close(); err != nil {
					t.Fatal(err)
				}
			}
			if tc.hold {
				held, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = held.Close() })
				if tc.release >= 0 {
					time.AfterFunc(tc.release, func() { _ = held.Close() })
				}
			}
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			l, waited, err := Listen(ctx, addr, 50*time.Millisecond)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Listen(%s) = %v, want an error with %q", addr, err, tc.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("Listen(%s): %v", addr, err)
				}
				defer func() { _ = l.Close() }()
				if l.Addr().String() != addr {
					t.Errorf("bound %s, want %s", l.Addr(), addr)
				}
				if tc.hold && waited < tc.release {
					t.Errorf("bound after %s, before the holder released the address at %s", waited, tc.release)
				}
			}
			out := logs()
			if got := strings.Count(out, "HTTP address in use"); got != tc.wantWaiting {
				t.Errorf("%d in-use lines, want %d:\n%s", got, tc.wantWaiting, out)
			}
			if got := strings.Count(out, "Bound the HTTP address after it was freed"); got != tc.wantBound {
				t.Errorf("%d bound lines, want %d:\n%s", got, tc.wantBound, out)
			}
		})
	}
}

// TestServeAndGet: what an exec probe reports for each answer of the
// server on its socket, and for no server at all.
func TestServeAndGet(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.HandleFunc("/failing", func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "not registered and published yet", http.StatusServiceUnavailable)
	})
	ctx, _ := bufferedContext(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "probe.sock")
	// A socket file left by an earlier run of the container is replaced.
	stale, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = stale.Close()
	l, err := ListenUnix(ctx, socket)
	if err != nil {
		t.Fatalf("ListenUnix over a stale socket: %v", err)
	}
	served := make(chan error, 1)
	serveCtx, stop := context.WithCancel(ctx)
	go func() { served <- Serve(serveCtx, l, mux) }()

	for _, tc := range []struct {
		name, socket, path string
		wantErr            string
	}{
		{name: "ready", socket: socket, path: "/ok"},
		{name: "path without slash", socket: socket, path: "ok"},
		{name: "not ready", socket: socket, path: "/failing", wantErr: "503 Service Unavailable: not registered and published yet"},
		{name: "unknown path", socket: socket, path: "/nothing", wantErr: "404"},
		{name: "no server", socket: filepath.Join(dir, "absent.sock"), path: "/ok", wantErr: "absent.sock"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Get(ctx, tc.socket, tc.path)
			if tc.wantErr == "" && err != nil {
				t.Errorf("Get(%s) = %v, want nil", tc.path, err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("Get(%s) = %v, want an error with %q", tc.path, err, tc.wantErr)
			}
		})
	}

	stop()
	if err := <-served; err != nil {
		t.Errorf("Serve after its context ended: %v", err)
	}
	if _, err := os.Lstat(socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after Serve returned: %v, want it removed", err)
	}
}

// TestListenUnixRefusesOtherFiles: a regular file at the socket's path is
// somebody's data, not a leftover socket.
func TestListenUnixRefusesOtherFiles(t *testing.T) {
	ctx, _ := bufferedContext(t)
	path := filepath.Join(t.TempDir(), "probe.sock")
	if err := os.WriteFile(path, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ListenUnix(ctx, path); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("ListenUnix over a regular file = %v, want a not-a-socket error", err)
	}
}
