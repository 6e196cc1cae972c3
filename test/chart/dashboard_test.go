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

package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prismgpu/prism/pkg/plugin"
	"github.com/prismgpu/prism/pkg/webhook"
)

// registeredMetrics are the names of every metric the plugin and the
// controller register, observed or not.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	controller := prometheus.NewRegistry()
	if _, err := webhook.NewMetrics(controller); err != nil {
		t.Fatal(err)
	}
	// Desc has no name accessor; its String form is stable and quotes it.
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	names := map[string]bool{}
	for _, reg := range []*prometheus.Registry{plugin.NewMetrics().Registry, controller} {
		descs := make(chan *prometheus.Desc)
		go func() {
			reg.Describe(descs)
			close(descs)
		}()
		for d := range descs {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

// The dashboard names metrics as strings; a metric renamed in code would
// leave an empty panel that nobody notices.
func TestDashboardNamesOnlyMetricsTheBinariesExport(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "prism.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("dashboards/prism.json: %v", err)
	}
	registered := registeredMetrics(t)
	metric := regexp.MustCompile(`\bprism_[a-z0-9_]+`)
	var used []string
	for _, p := range dashboard.Panels {
		for _, target := range p.Targets {
			for _, name := range metric.FindAllString(target.Expr, -1) {
				base := name
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if trimmed, ok := strings.CutSuffix(name, suffix); ok && registered[trimmed] {
						base = trimmed
					}
				}
				if !registered[base] {
					t.Errorf("panel %q queries %s, which neither binary exports", p.Title, name)
				}
				used = append(used, base)
			}
		}
	}
	// What the dashboard is for: prepare latency, rewrites and skips,
	// profiling, taints.
	for _, want := range []string{
		"prism_plugin_request_duration_seconds",
		"prism_webhook_rewrites_total",
		"prism_webhook_rewrite_skipped_total",
		"prism_webhook_profiling_requested_total",
		"prism_plugin_gpu_health_events_total",
	} {
		if !slices.Contains(used, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}
