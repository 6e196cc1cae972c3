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
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"google.golang.org/grpc"
	"k8s.io/klog/v2"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func probe(t *testing.T, mux *http.ServeMux, path string) int {
	t.Helper()
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// TestProbes: liveness holds while the plugin starts and while the driver
// lock changes hands, and fails once one holder keeps it past StuckAfter;
// readiness waits for registration and publication.
func TestProbes(t *testing.T) {
	probes := &Probes{StuckAfter: time.Minute}
	mux := http.NewServeMux()
	probes.Register(mux)
	if code := probe(t, mux, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz before the driver exists = %d, want 200", code)
	}
	if code := probe(t, mux, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before the driver exists = %d, want 503", code)
	}

	d, clock := healthDriver(t, t.TempDir(), nil)
	probes.driver.Store(d)
	if code := probe(t, mux, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz before registration = %d, want 503", code)
	}
	close(d.ready)
	if code := probe(t, mux, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz once published, before the kubelet registered the plugin = %d, want 503", code)
	}
	watch := d.watchRegistration(klog.Background())
	notify := func(registered bool) {
		t.Helper()
		status := &registerapi.RegistrationStatus{PluginRegistered: registered, Error: "refused for the test"}
		if _, err := watch(context.Background(), status, &grpc.UnaryServerInfo{}, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
	}
	notify(false)
	if code := probe(t, mux, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz after the kubelet refused the registration = %d, want 503", code)
	}
	notify(true)
	if code := probe(t, mux, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once published and registered = %d, want 200", code)
	}

	d.state.guard.mu.Lock()
	clock.Step(30 * time.Second)
	if code := probe(t, mux, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz with the lock held 30s = %d, want 200", code)
	}
	clock.Step(time.Minute)
	if code := probe(t, mux, "/healthz"); code != http.StatusServiceUnavailable {
		t.Errorf("/healthz with the lock held 90s = %d, want 503", code)
	}
	d.state.guard.mu.Unlock()
	if code := probe(t, mux, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after the lock was released = %d, want 200", code)
	}
}
