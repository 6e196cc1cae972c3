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
	usage *usageMetrics
}

// NewMetrics registers the plugin's metrics and the Go runtime collectors.
func NewMetrics() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "requests_total",
			Help: "NodePrepareResources and NodeUnprepareResources claims handled, by method and result.",
		}, []string{"method", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "request_duration_seconds",
			Help:    "Time to handle one kubelet call, by method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5},
		}, []string{"method"}),
		claimErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "claim_errors_total",
			Help: "Claims whose prepare or unprepare failed, by method and reason.",
		}, []string{"method", "reason"}),
		preparedDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "prepared_devices",
			Help: "Devices currently prepared for claims on this node.",
		}),
		preparedClaims: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "prepared_claims",
			Help: "Claims currently prepared on this node.",
		}),
		publishedDevices: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "published_devices",
			Help: "Devices published in this node's ResourceSlices.",
		}),
		checkpointRecover: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "checkpoint_recoveries_total",
			Help: "Repairs made to the checkpoint or CDI specs at start-up, by kind.",
		}, []string{"kind"}),
		healthEvents: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "gpu_health_events_total",
			Help: "GPU health changes: fatal Xids that tainted a GPU, ignored application Xids, GPUs NVML could not read, recoveries.",
		}, []string{"kind"}),
		profilingRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "profiling_runs_total",
			Help: "Profiled claims' reports collected after unprepare, by outcome: ReportCollected, or why no usable report was found (ReportMissing, ReportUnparseable, ProfilerFailed, ReportRejected, ReportTooLarge).",
		}, []string{"outcome"}),
		profileCollectionsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "profile_collections_pending",
			Help: "Reports of unprepared profiled claims waiting to be collected, published to their WorkloadProfile and archived.",
		}),
		slicesRepublished: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "resourceslices_republished_total",
			Help: "This node's ResourceSlices published again at once after they were deleted, as a starting kubelet deletes them.",
		}),
		apiFeatureDropped: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "api_feature_dropped",
			Help: "1 once the API server was seen dropping what this feature gate governs from the published ResourceSlice (the gate is off on the cluster); absent otherwise.",
		}, []string{"gate"}),
	}
	m.Registry.MustRegister(m.healthEvents, m.slicesRepublished, m.profilingRuns, m.profileCollectionsPending, m.apiFeatureDropped, m.requests, m.duration, m.claimErrors, m.preparedDevices, m.preparedClaims,
		m.publishedDevices, m.checkpointRecover,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.usage = newUsageMetrics(m.Registry)
	return m
}
