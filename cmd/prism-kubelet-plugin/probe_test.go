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

package main

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/prismgpu/prism/internal/envflag/envflagtest"
	"github.com/prismgpu/prism/internal/plugin"
)

// TestProbeCommand runs the exec probe against a plugin's probe socket as
// serveHTTP serves it. The driver has not started, so the plugin is alive
// and not ready.
func TestProbeCommand(t *testing.T) {
	ctx := testContext(t)
	dir := t.TempDir()
	socket := filepath.Join(dir, "probe.sock")
	serveHTTP(ctx, "", socket, &plugin.Probes{}, plugin.NewMetrics())

	for _, tc := range []struct {
		name       string
		args       []string
		env        map[string]string
		wantStatus int
		wantStderr string
	}{
		{name: "alive", args: []string{"--socket", socket, "healthz"}, wantStatus: 0},
		{name: "socket from the container's environment", args: []string{"healthz"}, env: map[string]string{"PRISM_PROBE_SOCKET": socket}, wantStatus: 0},
		{name: "not ready yet", args: []string{"--socket=" + socket, "readyz"}, wantStatus: 1, wantStderr: "503 Service Unavailable: starting"},
		{name: "no plugin on the socket", args: []string{"--socket", filepath.Join(dir, "other.sock"), "healthz"}, wantStatus: 1, wantStderr: "other.sock"},
		{name: "unknown endpoint", args: []string{"--socket", socket, "metrics"}, wantStatus: 2, wantStderr: "want one of healthz, readyz"},
		{name: "no endpoint", args: []string{"--socket", socket}, wantStatus: 2, wantStderr: "want one of healthz, readyz"},
		{name: "no socket", args: []string{"healthz"}, wantStatus: 2, wantStderr: "PRISM_PROBE_SOCKET"},
		{name: "unknown flag", args: []string{"--port=8080", "healthz"}, wantStatus: 2, wantStderr: "unknown flag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr strings.Builder
			got := probeMain(tc.args, &stderr, envflagtest.Lookup(tc.env))
			if got != tc.wantStatus || !strings.Contains(stderr.String(), tc.wantStderr) {
				t.Errorf("probe %v = %d, stderr %q; want %d with %q", tc.args, got, stderr.String(), tc.wantStatus, tc.wantStderr)
			}
		})
	}
}

// TestProbesWhileTheHTTPAddressIsTaken: the new pod of a host-network
// rolling update finds its HTTP port held by the old one. Its probes answer
// on the socket meanwhile, and it serves the port once the old one lets go.
func TestProbesWhileTheHTTPAddressIsTaken(t *testing.T) {
	ctx := testContext(t)
	old, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = old.Close() }()
	addr := old.Addr().String()
	socket := filepath.Join(t.TempDir(), "probe.sock")
	serveHTTP(ctx, addr, socket, &plugin.Probes{}, plugin.NewMetrics())

	var stderr strings.Builder
	if got := probeMain([]string{"--socket", socket, "healthz"}, &stderr, envflagtest.Lookup(nil)); got != 0 {
		t.Fatalf("probe while the port is taken = %d (%s), want 0", got, stderr.String())
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("GET /healthz once the port was freed = %s", resp.Status)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the plugin never served %s after it was freed: %v", addr, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// testContext is a test's context, logging to the test and cancelled when
// it ends, which stops what serveHTTP started.
func testContext(t *testing.T) context.Context {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	return ctx
}
