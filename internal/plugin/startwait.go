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
	"fmt"
	"time"

	"k8s.io/client-go/discovery"
	"k8s.io/klog/v2"
)

// How often a plugin that is not ready yet says why.
const (
	notReadyFirstReport = 10 * time.Second
	notReadyReportEvery = 30 * time.Second
)

// reportWhileNotReady logs, until done is closed, why the plugin is not ready
// yet. The first publish waits for the helper's ResourceSlice informer to
// sync, and while the API server cannot be reached that wait says nothing at
// all: the pod would stay unready with a silent log. Each report asks the API
// server for its version, so the line says whether it is the API server.
func (d *Driver) reportWhileNotReady(ctx context.Context, done <-chan struct{}, first, every time.Duration) {
	logger := klog.FromContext(ctx)
	start := d.clock.Now()
	wait := first
	for {
		timer := d.clock.NewTimer(wait)
		select {
		case <-done:
			timer.Stop()
			return
		case <-ctx.Done():
			timer.Stop()
			return
		case <-timer.C():
		}
		waited := d.clock.Since(start).Round(time.Second)
		if err := d.pingAPIServer(ctx, every); err != nil {
			logger.Error(err, "Not ready: the API server cannot be reached, so the ResourceSlice cannot be published; retrying", "waited", waited)
			d.metrics.claimErrors.WithLabelValues("start", "api-unreachable").Inc()
		} else {
			logger.Info("Not ready: the API server answers, but the ResourceSlice informer has not synced yet; check the plugin's RBAC on resourceslices", "waited", waited)
		}
		wait = every
	}
}

// pingAPIServer asks the API server for its version, bounded by timeout.
func (d *Driver) pingAPIServer(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var err error
	if v, ok := d.cfg.KubeClient.Discovery().(discovery.ServerVersionInterfaceWithContext); ok {
		_, err = v.ServerVersionWithContext(ctx)
	} else {
		_, err = d.cfg.KubeClient.Discovery().ServerVersion()
	}
	if err != nil {
		return fmt.Errorf("get the API server's version: %w", err)
	}
	return nil
}
