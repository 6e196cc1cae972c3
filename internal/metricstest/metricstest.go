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

// Package metricstest reads what tests assert of Prometheus metrics.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Counters gathers the counter name from g and returns its non-zero
// series by the value of their label label; nil where it has none. Zero
// series are left out: metrics often create theirs at start, so that they
// are exported before the first event.
func Counters(t testing.TB, g prometheus.Gatherer, name, label string) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]float64
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, p := range m.GetLabel() {
				if p.GetName() != label || m.GetCounter().GetValue() == 0 {
					continue
				}
				if out == nil {
					out = map[string]float64{}
				}
				out[p.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}
