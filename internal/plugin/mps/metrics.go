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

package mps

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Results of a daemon start, as counted by prism_plugin_mps_daemon_starts_total.
const (
	ResultStarted   = "started"
	ResultRestarted = "restarted"
	ResultAdopted   = "adopted"
	ResultFailed    = "failed"
)

// Results of a daemon stop, as counted by prism_plugin_mps_daemon_stops_total.
const (
	// StopQuit: it quit when told to.
	StopQuit = "quit"
	// StopKilled: it did not quit within the stop timeout, and was killed.
	StopKilled = "killed"
	// StopUnreachable: its control pipe was gone or not its own, so it
	// could not be told, and was killed at once.
	StopUnreachable = "unreachable"
)

type metrics struct {
	daemons   prometheus.Gauge
	starts    *prometheus.CounterVec
	stops     *prometheus.CounterVec
	available prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		daemons:   prometheus.NewGauge(prometheus.GaugeOpts(pluginOpts("mps_daemons", "MPS control daemons the plugin runs, one per GPU with shares enforced by MPS."))),
		starts:    prometheus.NewCounterVec(prometheus.CounterOpts(pluginOpts("mps_daemon_starts_total", "MPS control daemons started, by result: started, restarted (the previous one had died, or could not be reached, while shares remained), adopted (found running after a plugin restart), failed.")), []string{"result"}),
		stops:     prometheus.NewCounterVec(prometheus.CounterOpts(pluginOpts("mps_daemon_stops_total", "MPS control daemons stopped, by result: quit (when told), killed (it did not quit in time), unreachable (its control pipe was gone or not its own, so it was killed at once).")), []string{"result"}),
		available: prometheus.NewGauge(prometheus.GaugeOpts(pluginOpts("mps_available", "1 when shares are enforced by MPS; 0 when the driver root has no nvidia-cuda-mps-control and shares run time-sliced."))),
	}
	for _, r := range []string{ResultStarted, ResultRestarted, ResultAdopted, ResultFailed} {
		m.starts.WithLabelValues(r)
	}
	for _, r := range []string{StopQuit, StopKilled, StopUnreachable} {
		m.stops.WithLabelValues(r)
	}
	if reg != nil {
		// A plugin restarted in the same process (tests do) registers again:
		// it carries on with the collectors already there.
		m.daemons = register(reg, m.daemons)
		m.starts = register(reg, m.starts)
		m.stops = register(reg, m.stops)
		m.available = register(reg, m.available)
	}
	return m
}

// pluginOpts names the metric prism_plugin_<name>: the daemons are the
// kubelet plugin's, and their metrics are served with its own.
func pluginOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: "prism", Subsystem: "plugin", Name: name, Help: help}
}

func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(c); errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing
		}
	} else if err != nil {
		panic(err)
	}
	return c
}
