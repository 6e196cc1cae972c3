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
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// DefaultStuckAfter is how long one prepare or unprepare may hold the
// driver lock before the plugin counts as hung. The slowest legitimate
// holder, a first nvidia-smi or nvcdi call on a busy node, takes seconds.
const DefaultStuckAfter = 2 * time.Minute

// Probes answer the kubelet's liveness and readiness checks. They exist
// before the driver, so that the HTTP server starts first and a slow start
// (NVML, the kubelet, the API server) is seen as starting rather than dead.
type Probes struct {
	// StuckAfter is how long the driver lock may be held at once before
	// liveness fails; DefaultStuckAfter when zero.
	StuckAfter time.Duration
	driver     atomic.Pointer[Driver]
}

// Live fails when the driver lock has been held past StuckAfter: every
// prepare and unprepare on the node would be waiting behind it, and only a
// restart frees it.
func (p *Probes) Live() error {
	d := p.driver.Load()
	if d == nil {
		return nil
	}
	stuckAfter := p.StuckAfter
	if stuckAfter == 0 {
		stuckAfter = DefaultStuckAfter
	}
	if held := d.state.guard.mu.heldFor(); held > stuckAfter {
		return fmt.Errorf("the driver lock has been held for %s", held.Truncate(time.Second))
	}
	return nil
}

// Ready succeeds once the plugin has published its slice and the kubelet
// has registered it, so that a pod's prepare reaches it. The kubelet's
// plugin watcher registers a new socket on its next pass, about a second
// after the plugin serves it; a pod whose prepare came before that would
// wait out the kubelet's 10-15 s retry.
func (p *Probes) Ready() error {
	d := p.driver.Load()
	if d == nil {
		return errors.New("starting")
	}
	select {
	case <-d.ready:
	default:
		return errors.New("slice not published yet")
	}
	if !d.kubeletRegistered.Load() {
		return errors.New("not registered by the kubelet yet")
	}
	return nil
}

// watchRegistration is a gRPC interceptor that notes the kubelet's answer
// to the plugin's registration, which the DRA helper keeps to itself: Ready
// waits for it, and a refusal is logged with the kubelet's reason.
func (d *Driver) watchRegistration(logger klog.Logger) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if status, ok := req.(*registerapi.RegistrationStatus); ok {
			if !status.PluginRegistered {
				logger.Error(nil, "The kubelet refused to register the plugin", "reason", status.Error)
			} else if !d.kubeletRegistered.Swap(true) {
				logger.Info("The kubelet registered the plugin")
			}
		}
		return handler(ctx, req)
	}
}

// Register serves /healthz from Live and /readyz from Ready.
func (p *Probes) Register(mux *http.ServeMux) {
	mux.HandleFunc("/healthz", probeHandler(p.Live))
	mux.HandleFunc("/readyz", probeHandler(p.Ready))
}

func probeHandler(check func() error) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		if err := check(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}
}
