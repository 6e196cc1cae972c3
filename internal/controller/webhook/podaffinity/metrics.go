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

package podaffinity

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/prismgpu/prism/internal/controller/webhook"
)

// Metrics count pods by what the pod webhook did.
type Metrics struct {
	outcomes *prometheus.CounterVec
}

// NewMetrics creates the collector and registers it with reg. A nil reg
// leaves it unregistered, which is what tests want.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		outcomes: webhook.CounterVec("prism_webhook_pod_preference_total", "Pods the node-preference webhook admitted, by outcome (affinity-added, or why not).", "outcome"),
	}
	return webhook.Registered(reg, m, m.outcomes)
}
