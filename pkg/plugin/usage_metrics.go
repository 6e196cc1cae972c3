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

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/usage"
)

// usageMetrics are the per-pod GPU figures the sampler reads, and what
// became of the runs.
type usageMetrics struct {
	dutyCycle     *prometheus.GaugeVec
	memoryUsed    *prometheus.GaugeVec
	smActivity    *prometheus.GaugeVec
	shareExceeded *prometheus.CounterVec
	runs          *prometheus.CounterVec
}

// usageLabels name a claim's GPU: the pod is the first that reserved the
// claim (a claim of a pod's template has one).
var usageLabels = []string{"namespace", "pod", "claim", "gpu"}

func newUsageMetrics(r prometheus.Registerer) *usageMetrics {
	m := &usageMetrics{
		dutyCycle: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "gpu_duty_cycle_percent",
			Help: "Share of the last NVML sample period in which the claim's kernels ran on the GPU; on a shared GPU, its own processes' figure.",
		}, usageLabels),
		memoryUsed: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "gpu_memory_used_bytes",
			Help: "GPU memory the claim's workload holds; on a shared GPU, its own processes' memory.",
		}, usageLabels),
		smActivity: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "gpu_sm_activity_percent",
			Help: "GPM SM activity of a GPU the claim holds alone, on GPUs with GPM (Hopper and later).",
		}, usageLabels),
		shareExceeded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "share_exceeded_total",
			Help: "Runs on a share of a GPU that used more than they were given, by resource (memory, compute).",
		}, []string{"resource"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "prism", Subsystem: "plugin", Name: "usage_runs_total",
			Help: "Claims' GPU usage runs after unprepare, by outcome: Merged into the WorkloadProfile, TooShort, NoProfile, PublishFailed.",
		}, []string{"outcome"}),
	}
	r.MustRegister(m.dutyCycle, m.memoryUsed, m.smActivity, m.shareExceeded, m.runs)
	return m
}

// set exports one sample; a figure the sample lacks is left out.
func (m *usageMetrics) set(c prismv1alpha1.ClaimReference, pod, gpu string, s usage.Sample) {
	labels := prometheus.Labels{"namespace": c.Namespace, "pod": pod, "claim": c.Name, "gpu": gpu}
	if s.DutyCyclePercent != usage.Unknown {
		m.dutyCycle.With(labels).Set(float64(s.DutyCyclePercent))
	}
	if s.MemoryBytes != usage.Unknown {
		m.memoryUsed.With(labels).Set(float64(s.MemoryBytes))
	}
	if s.SMActivityPercent != usage.Unknown {
		m.smActivity.With(labels).Set(s.SMActivityPercent)
	}
}

// forget removes an unprepared claim's series.
func (m *usageMetrics) forget(c prismv1alpha1.ClaimReference) {
	labels := prometheus.Labels{"namespace": c.Namespace, "claim": c.Name}
	m.dutyCycle.DeletePartialMatch(labels)
	m.memoryUsed.DeletePartialMatch(labels)
	m.smActivity.DeletePartialMatch(labels)
}
