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
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/claimrewrite"
	"github.com/prismgpu/prism/internal/controller/webhook/podaffinity"
	"github.com/prismgpu/prism/internal/plugin"
)

// registeredMetrics are the names of every metric the plugin and the
// controller register, observed or not.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	controller := prometheus.NewRegistry()
	if _, err := webhook.NewMetrics(controller); err != nil {
		t.Fatal(err)
	}
	if _, err := claimrewrite.NewMetrics(controller); err != nil {
		t.Fatal(err)
	}
	if _, err := podaffinity.NewMetrics(controller); err != nil {
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

// dashboardPanel is what the tests read of a panel.
type dashboardPanel struct {
	ID      int
	Type    string
	Title   string
	GridPos struct{ H, W, X, Y int }
	Targets []struct{ Expr, LegendFormat string }
}

func readDashboard(t *testing.T) (panels []dashboardPanel, variableQueries []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "prism.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dashboard struct {
		Panels     []dashboardPanel
		Templating struct {
			List []struct{ Definition string }
		}
	}
	if err := json.Unmarshal(raw, &dashboard); err != nil {
		t.Fatalf("dashboards/prism.json: %v", err)
	}
	for _, v := range dashboard.Templating.List {
		variableQueries = append(variableQueries, v.Definition)
	}
	return dashboard.Panels, variableQueries
}

// The dashboard names metrics as strings; a metric renamed in code would
// leave an empty panel that nobody notices, and one missing from
// docs/reference.md a panel nobody can read.
func TestDashboardNamesOnlyMetricsTheBinariesExport(t *testing.T) {
	panels, variableQueries := readDashboard(t)
	registered := registeredMetrics(t)
	documented, err := os.ReadFile(filepath.Join(repoRoot, "docs", "reference.md"))
	if err != nil {
		t.Fatal(err)
	}
	metric := regexp.MustCompile(`\bprism_[a-z0-9_]+`)
	var used []string
	check := func(where, expr string) {
		for _, name := range metric.FindAllString(expr, -1) {
			base := name
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if trimmed, ok := strings.CutSuffix(name, suffix); ok && registered[trimmed] {
					base = trimmed
				}
			}
			if !registered[base] {
				t.Errorf("%s queries %s, which neither binary exports", where, name)
			}
			if !strings.Contains(string(documented), "`"+base+"`") {
				t.Errorf("%s queries %s, which docs/reference.md does not document", where, base)
			}
			used = append(used, base)
		}
	}
	for _, p := range panels {
		for _, target := range p.Targets {
			check(fmt.Sprintf("panel %q", p.Title), target.Expr)
		}
	}
	for _, q := range variableQueries {
		check("dashboard variable", q)
	}
	// What the dashboard is for: prepare latency, rewrites and skips,
	// profiling, taints, and what each pod does with its GPUs.
	for _, want := range []string{
		"prism_plugin_request_duration_seconds",
		"prism_webhook_rewrites_total",
		"prism_webhook_rewrite_skipped_total",
		"prism_webhook_profiling_requested_total",
		"prism_plugin_gpu_health_events_total",
		"prism_plugin_gpu_duty_cycle_percent",
		"prism_plugin_gpu_memory_used_bytes",
		"prism_plugin_gpu_sm_activity_percent",
		"prism_plugin_gpu_dram_activity_percent",
	} {
		if !slices.Contains(used, want) {
			t.Errorf("no panel queries %s", want)
		}
	}
}

// A per-pod series is only worth its labels if the legend shows whose it
// is: the pod and the GPU.
func TestDashboardPerPodPanelsNameThePod(t *testing.T) {
	panels, _ := readDashboard(t)
	perPod := regexp.MustCompile(`\bprism_plugin_gpu_(duty_cycle|memory_used|sm_activity|dram_activity)_`)
	found := 0
	for _, p := range panels {
		for _, target := range p.Targets {
			if !perPod.MatchString(target.Expr) {
				continue
			}
			found++
			if want := "{{namespace}}/{{pod}} {{gpu}}"; target.LegendFormat != want {
				t.Errorf("panel %q: legend %q, want %q", p.Title, target.LegendFormat, want)
			}
		}
	}
	if found == 0 {
		t.Error("no panel queries a per-pod GPU metric")
	}
}

// Grafana places panels by id and gridPos; a duplicate id or two panels on
// the same cells leave one hidden behind the other.
func TestDashboardPanelsDoNotOverlap(t *testing.T) {
	panels, _ := readDashboard(t)
	ids := map[int]string{}
	type cell struct{ x, y int }
	taken := map[cell]string{}
	for _, p := range panels {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v outside the 24-column grid", p.Title, g)
		}
		for x := g.X; x < g.X+g.W; x++ {
			for y := g.Y; y < g.Y+g.H; y++ {
				if other, ok := taken[cell{x, y}]; ok {
					t.Errorf("panels %q and %q overlap at column %d, row %d", other, p.Title, x, y)
					return
				}
				taken[cell{x, y}] = p.Title
			}
		}
	}
}
