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

// Package localserve serves a process's local HTTP endpoints (metrics,
// health) in the two ways a host-network DaemonSet pod needs while a rolling
// update runs two of its pods on one node at once: on a TCP address that the
// pod being replaced may still hold, and on a Unix socket of the pod's own,
// which an exec probe asks through Get.
package localserve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"time"

	"k8s.io/klog/v2"
)

// RetryEvery is how often Listen tries an address in use again: the pod
// holding it exits seconds after its replacement is ready.
const RetryEvery = time.Second

// remindEvery is how often Listen repeats that it is still waiting: a port
// held for good by something else must not go unnoticed, nor flood the log.
const remindEvery = 10 * time.Minute

// Listen binds a TCP listener on addr. While another process holds the
// address (EADDRINUSE) it says so once, tries again every interval, and
// returns once bound, with how long it waited; it logs the bind when it had
// to wait. Other errors, and ctx ending, return at once.
func Listen(ctx context.Context, addr string, interval time.Duration) (net.Listener, time.Duration, error) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	var lastSaid time.Time
	var lc net.ListenConfig
	for {
		l, err := lc.Listen(ctx, "tcp", addr)
		if err == nil {
			waited := time.Since(start)
			if !lastSaid.IsZero() {
				logger.Info("Bound the HTTP address after it was freed", "address", addr, "waited", waited.Round(time.Millisecond))
			}
			return l, waited, nil
		}
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, time.Since(start), fmt.Errorf("listen on %s: %w", addr, err)
		}
		if lastSaid.IsZero() || time.Since(lastSaid) >= remindEvery {
			logger.Info("HTTP address in use, likely by the pod this one replaces in a rolling update on the host network; serving it once it is free",
				"address", addr, "retryEvery", interval, "waiting", time.Since(start).Round(time.Second))
			lastSaid = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil, time.Since(start), fmt.Errorf("listen on %s: gave up waiting for the address: %w", addr, context.Cause(ctx))
		case <-time.After(interval):
		}
	}
}

// ListenUnix binds a Unix socket at path, replacing a socket file left by an
// earlier run of the same container. Anything else at path is an error.
func ListenUnix(ctx context.Context, path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != os.ModeSocket {
			return nil, fmt.Errorf("listen on %s: exists and is not a socket", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen on %s: remove the old socket: %w", path, err)
		}
	}
	var lc net.ListenConfig
	l, err := lc.Listen(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	return l, nil
}

// Serve serves h on l until ctx ends, then closes l.
func Serve(ctx context.Context, l net.Listener, h http.Handler) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-stopped:
		}
	}()
	if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve on %s: %w", l.Addr(), err)
	}
	return nil
}

// Get asks the server on the Unix socket for path and fails unless it
// answers 200, with the server's answer in the error.
func Get(ctx context.Context, socket, path string) error {
	client := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}}
	// The host is never resolved: the transport dials the socket.
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://localhost/"+strings.TrimPrefix(path, "/"), nil)
	if err != nil {
		return fmt.Errorf("ask %s on %s: %w", path, socket, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("ask %s on %s: %w", path, socket, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s on %s: %s: %s", path, socket, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}
