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
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
)

// TestNotReadySaysWhy: while the first publish waits, the plugin says every
// interval whether the API server can be reached, and stops once ready.
func TestNotReadySaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name        string
		apiDown     bool
		wantLog     string
		wantCounter bool
	}{
		{"API server unreachable", true, "the API server cannot be reached", true},
		{"API server answers", false, "the ResourceSlice informer has not synced yet", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newTestDriver(t, "t4-2.yaml", t.TempDir())
			cs := fake.NewClientset()
			if tc.apiDown {
				cs.PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, errors.New("dial tcp 127.0.0.1:6443: connect: connection refused")
				})
			}
			d.cfg.KubeClient = cs
			logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(t.Context(), logger)
			buffer := logger.GetSink().(ktesting.Underlier).GetBuffer()
			done := make(chan struct{})
			stopped := make(chan struct{})
			go func() {
				d.reportWhileNotReady(ctx, done, time.Millisecond, time.Millisecond)
				close(stopped)
			}()
			err := wait.PollUntilContextTimeout(t.Context(), time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
				return strings.Count(buffer.String(), "Not ready:") >= 2, nil
			})
			if err != nil {
				t.Fatalf("fewer than two reports: %q", buffer.String())
			}
			close(done)
			<-stopped
			if !strings.Contains(buffer.String(), tc.wantLog) {
				t.Errorf("log %q does not say %q", buffer.String(), tc.wantLog)
			}
			unreachable := testutil.ToFloat64(d.metrics.claimErrors.WithLabelValues("start", "api-unreachable"))
			if (unreachable > 0) != tc.wantCounter {
				t.Errorf("prism_plugin_claim_errors_total{start,api-unreachable} = %v, want counted: %v", unreachable, tc.wantCounter)
			}
		})
	}
}
