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

package sampler

import (
	"github.com/prometheus/client_golang/prometheus"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/plugin/usage"
)

// Metrics are the per-pod GPU figures the sampler reads, and what became
// of the runs: prism_plugin_*, on the plugin's registry, which registers
// them whether or not the plugin samples.
type Metrics struct {
	dutyCycle     *prometheus.GaugeVec
	memoryUsed    *prometheus.GaugeVec
	smActivity    *prometheus.GaugeVec
	dramActivity  *prometheus.GaugeVec
	shareExceeded *prometheus.CounterVec
	runs          *prometheus.CounterVec
	unattributed  *prometheus.CounterVec
}

// Why a claim's sample of a shared GPU lacks a figure: a process there
// could be the claim's and could not be counted as such.
const (
	// unattributedUnreadable: a process whose cgroup cannot be read.
	unattributedUnreadable = "unreadable"
	// unattributedMPSServer: the MPS server's PID holds work of several
	// MPS shares of the GPU.
	unattributedMPSServer = "mps-server"
)

// usageLabels name a claim's GPU: the pod is the first that reserved the
// claim (a claim of a pod's template has one).
var usageLabels = []string{"namespace", "pod", "claim", "gpu"}

// NewMetrics registers the sampler's metrics with r.
func NewMetrics(r prometheus.Registerer) *Metrics {
	return &Metrics{
		dutyCycle:     gaugeVec(r, "gpu_duty_cycle_percent", "Share of the last NVML sample period in which the claim's kernels ran on the GPU; on a shared GPU, its own processes' figure.", usageLabels...),
		memoryUsed:    gaugeVec(r, "gpu_memory_used_bytes", "GPU memory the claim's workload holds; on a shared GPU, its own processes' memory.", usageLabels...),
		smActivity:    gaugeVec(r, "gpu_sm_activity_percent", "GPM SM activity of a GPU the claim holds alone, on GPUs with GPM (Hopper and later).", usageLabels...),
		dramActivity:  gaugeVec(r, "gpu_dram_activity_percent", "GPM DRAM bandwidth use of a GPU the claim holds alone, on GPUs with GPM (Hopper and later).", usageLabels...),
		shareExceeded: counterVec(r, "share_exceeded_total", "Runs on a share of a GPU that used more than they were given, by resource (memory, compute).", "resource"),
		runs:          counterVec(r, "usage_runs_total", "Claims' GPU usage runs after unprepare, by outcome: Merged into the WorkloadProfile, TooShort, NoProfile, PublishFailed.", "outcome"),
		unattributed:  counterVec(r, "usage_unattributed_total", "Samples of claims on shared GPUs that lack a figure because a process that could be the claim's could not be counted, by reason: unreadable (its cgroup cannot be read), mps-server (the MPS server holds work of several shares).", "reason"),
	}
}

// set exports one sample. A figure the sample lacks removes its series
// rather than leave the last value standing as if it were current: a GPM
// read that starts failing must not show yesterday's activity.
func (m *Metrics) set(c prismv1alpha1.ClaimReference, pod, gpu string, s usage.Sample) {
	labels := prometheus.Labels{"namespace": c.Namespace, "pod": pod, "claim": c.Name, "gpu": gpu}
	setKnown(m.dutyCycle, labels, float64(s.DutyCyclePercent), s.DutyCyclePercent != usage.Unknown)
	setKnown(m.memoryUsed, labels, float64(s.MemoryBytes), s.MemoryBytes != usage.Unknown)
	setKnown(m.smActivity, labels, s.SMActivityPercent, s.SMActivityPercent != usage.Unknown)
	setKnown(m.dramActivity, labels, s.DRAMActivityPercent, s.DRAMActivityPercent != usage.Unknown)
}

func setKnown(g *prometheus.GaugeVec, labels prometheus.Labels, v float64, known bool) {
	if known {
		g.With(labels).Set(v)
	} else {
		g.Delete(labels)
	}
}

// forget removes an ended claim's series, whichever path released it:
// the series are one per prepared claim and GPU, so they stay bounded by
// what the node holds now.
func (m *Metrics) forget(c prismv1alpha1.ClaimReference) {
	labels := prometheus.Labels{"namespace": c.Namespace, "claim": c.Name}
	for _, g := range []*prometheus.GaugeVec{m.dutyCycle, m.memoryUsed, m.smActivity, m.dramActivity} {
		g.DeletePartialMatch(labels)
	}
}

func gaugeVec(r prometheus.Registerer, name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prism", Subsystem: "plugin", Name: name, Help: help}, labels)
	r.MustRegister(g)
	return g
}

func counterVec(r prometheus.Registerer, name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prism", Subsystem: "plugin", Name: name, Help: help}, labels)
	r.MustRegister(c)
	return c
}
