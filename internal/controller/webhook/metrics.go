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
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/klog/v2"
)

// Metrics are the Prometheus collectors that the webhooks share: review
// latency and denials. One value is shared by all handlers of a process;
// the mutating handlers count what they did in metrics of their own
// (claimrewrite.Metrics, podaffinity.Metrics).
type Metrics struct {
	denied   *prometheus.CounterVec
	refused  *prometheus.CounterVec
	waited   *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

// NewMetrics creates the collectors and registers them with reg. A nil reg
// leaves them unregistered, which is what tests and benchmarks want.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		denied:  CounterVec("prism_webhook_validation_denied_total", "Objects rejected by the validating webhook, by kind.", "kind"),
		refused: CounterVec("prism_webhook_requests_refused_total", "Requests answered without a review (too large, too many in flight, past their deadline) or whose object was not decoded (costly-object), by reason.", "reason"),
		waited:  CounterVec("prism_webhook_reviews_waited_total", "Reviews that read an informer not yet synced and waited for it, by informer and by how the wait ended (synced, deadline).", "informer", "outcome"),
		// Buckets start at 50µs: the in-process work is well below a
		// millisecond, and the default buckets (5ms and up) would put
		// every request in the first one.
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "prism_webhook_admission_duration_seconds",
			Help:    "Time from receiving an AdmissionReview to writing the response.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 14),
		}, []string{"webhook"}),
	}
	return Registered(reg, m, m.denied, m.refused, m.waited, m.duration)
}

// CounterVec is a webhook counter partitioned by labels.
func CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Registered registers collectors, those of a webhook's metrics m, with
// reg and returns m; a nil reg registers nothing. A webhook's NewMetrics
// returns what it returns, so that metrics that failed to register are not
// used.
func Registered[M any](reg prometheus.Registerer, m *M, collectors ...prometheus.Collector) (*M, error) {
	if reg == nil {
		return m, nil
	}
	for _, c := range collectors {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("registering webhook metrics: %w", err)
		}
	}
	return m, nil
}

// Denied counts an object a validating webhook rejected; kind is the label
// value.
func (m *Metrics) Denied(kind string) {
	m.denied.WithLabelValues(kind).Inc()
}

// refusedRequest counts a request refused for reason.
func (m *Metrics) refusedRequest(reason string) {
	m.refused.WithLabelValues(reason).Inc()
}

// named gives the webhook's reviews a logger of its name, and times them
// under that name.
func (m *Metrics) named(name string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		defer func() { m.duration.WithLabelValues(name).Observe(time.Since(start).Seconds()) }()
		h.ServeHTTP(w, r.WithContext(klog.NewContext(r.Context(), klog.FromContext(r.Context()).WithName(name))))
	})
}
