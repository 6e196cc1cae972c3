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
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
)

// Metrics are the plugin's Prometheus metrics, on a registry of their own so
// that tests can run several drivers in one process.
type Metrics struct {
	Registry          *prometheus.Registry
	requests          *prometheus.CounterVec
	duration          *prometheus.HistogramVec
	claimErrors       *prometheus.CounterVec
	preparedDevices   prometheus.Gauge
	preparedClaims    prometheus.Gauge
	publishedDevices  prometheus.Gauge
	checkpointRecover *prometheus.CounterVec
	healthEvents      *prometheus.CounterVec
	profilingRuns     *prometheus.CounterVec
	apiFeatureDropped *prometheus.GaugeVec
	// slicesRepublished counts this node's ResourceSlices published again
	// after someone else deleted them.
	slicesRepublished prometheus.Counter
	// profileCollectionsPending counts the reports of unprepared profiled
	// claims not yet collected, published and archived.
	profileCollectionsPending prometheus.Gauge
	// usage are the per-pod GPU figures and what became of the runs.
	usage *sampler.Metrics
}

// NewMetrics registers the plugin's metrics and the Go runtime collectors.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		requests: counterVec(r, "requests_total", "NodePrepareResources and NodeUnprepareResources claims handled, by method and result.", "method", "result"),
		duration: register(r, prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "request_duration_seconds",
			Help:    "Time to handle one kubelet call, by method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"method"})),
		claimErrors:               counterVec(r, "claim_errors_total", "Claims whose prepare or unprepare failed, by method and reason.", "method", "reason"),
		preparedDevices:           gauge(r, "prepared_devices", "Devices currently prepared for claims on this node."),
		preparedClaims:            gauge(r, "prepared_claims", "Claims currently prepared on this node."),
		publishedDevices:          gauge(r, "published_devices", "Devices published in this node's ResourceSlices."),
		checkpointRecover:         counterVec(r, "checkpoint_recoveries_total", "Repairs made to the checkpoint or CDI specs at start-up, by kind.", "kind"),
		healthEvents:              counterVec(r, "gpu_health_events_total", "GPU health changes: fatal Xids that tainted a GPU, ignored application Xids, GPUs NVML could not read, recoveries.", "kind"),
		profilingRuns:             counterVec(r, "profiling_runs_total", "Profiled claims' reports collected after unprepare, by outcome: ReportCollected, or why no usable report was found (ReportMissing, ReportUnparseable, ProfilerFailed, ReportRejected, ReportTooLarge).", "outcome"),
		profileCollectionsPending: gauge(r, "profile_collections_pending", "Reports of unprepared profiled claims waiting to be collected, published to their WorkloadProfile and archived."),
		slicesRepublished:         counter(r, "resourceslices_republished_total", "This node's ResourceSlices published again at once after they were deleted, as a starting kubelet deletes them."),
		apiFeatureDropped:         gaugeVec(r, "api_feature_dropped", "1 once the API server was seen dropping what this feature gate governs from the published ResourceSlice (the gate is off on the cluster); absent otherwise.", "gate"),
		usage:                     sampler.NewMetrics(r),
	}
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// The constructors below declare the metric prism_plugin_<name> and
// register it, so that a metric's name, help and labels are all that its
// declaration says.

func counter(r prometheus.Registerer, name, help string) prometheus.Counter {
	return register(r, prometheus.NewCounter(prometheus.CounterOpts(pluginOpts(name, help))))
}

func counterVec(r prometheus.Registerer, name, help string, labels ...string) *prometheus.CounterVec {
	return register(r, prometheus.NewCounterVec(prometheus.CounterOpts(pluginOpts(name, help)), labels))
}

func gauge(r prometheus.Registerer, name, help string) prometheus.Gauge {
	return register(r, prometheus.NewGauge(prometheus.GaugeOpts(pluginOpts(name, help))))
}

func gaugeVec(r prometheus.Registerer, name, help string, labels ...string) *prometheus.GaugeVec {
	return register(r, prometheus.NewGaugeVec(prometheus.GaugeOpts(pluginOpts(name, help)), labels))
}

func pluginOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "prism", Subsystem: "plugin", Name: name, Help: help}
}

func register[C prometheus.Collector](r prometheus.Registerer, c C) C {
	r.MustRegister(c)
	return c
}
