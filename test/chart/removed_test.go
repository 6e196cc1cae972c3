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
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestRemovedSchedulerValues: the chart no longer deploys prism-scheduler.
// A values file written for the chart that did still renders, and renders
// what the defaults do; one that switches the scheduler on is refused with
// what to do, rather than upgraded into pods that stay Pending.
func TestRemovedSchedulerValues(t *testing.T) {
	oldValues := filepath.Join("testdata", "values-with-scheduler.yaml")
	defaults := string(mustTemplate(t))
	const refusal = "scheduler.enabled: the chart no longer deploys prism-scheduler"
	for _, tc := range []struct {
		name        string
		args        []string
		wantRefusal bool
	}{
		{name: "values copied from the old values.yaml", args: []string{"--values", oldValues}},
		{name: "a digest pinned for the old image", args: []string{"--set", "image.schedulerDigest=sha256:2222222222222222222222222222222222222222222222222222222222222222"}},
		{name: "scheduler.enabled=false", args: []string{"--set", "scheduler.enabled=false"}},
		{name: "scheduler deleted with null", args: []string{"--values", oldValues, "--set", "scheduler=null"}},
		{name: "scheduler.enabled=true", args: []string{"--set", "scheduler.enabled=true"}, wantRefusal: true},
		{name: "old values switched on", args: []string{"--values", oldValues, "--set", "scheduler.enabled=true"}, wantRefusal: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, stderr, err := helmTemplate(t, tc.args...)
			if tc.wantRefusal {
				if err == nil || !strings.Contains(stderr, refusal) {
					t.Errorf("helm template %v: %v (%s), want a refusal saying %q", tc.args, err, strings.TrimSpace(stderr), refusal)
				}
				return
			}
			if err != nil {
				t.Fatalf("helm template %v: %v\n%s", tc.args, err, stderr)
			}
			if diff := cmp.Diff(defaults, string(out)); diff != "" {
				t.Errorf("helm template %v renders otherwise than the defaults (-defaults +got):\n%s", tc.args, diff)
			}
		})
	}
}

// TestRemovedPluginFlags: --gc-percent and --release-startup-pages became
// constants, and the plugin refuses a flag it does not know. extraArgs that
// pass one are refused with what to do, rather than upgraded into plugins
// that do not start; other arguments, and the old variables in extraEnv
// (which no flag reads now), still render.
func TestRemovedPluginFlags(t *testing.T) {
	for _, tc := range []struct {
		name        string
		args        []string
		wantRefusal string
	}{
		{name: "--gc-percent", args: []string{"--set", "kubeletPlugin.extraArgs={--gc-percent=80}"}, wantRefusal: "--gc-percent=80: the plugin no longer has --gc-percent"},
		{name: "--gc-percent and its value", args: []string{"--set-json", `kubeletPlugin.extraArgs=["--v=3","--gc-percent","80"]`}, wantRefusal: "the plugin no longer has --gc-percent"},
		{name: "--release-startup-pages", args: []string{"--set", "kubeletPlugin.extraArgs={--release-startup-pages=false}"}, wantRefusal: "the plugin no longer has --release-startup-pages"},
		{name: "-release-startup-pages", args: []string{"--set", "kubeletPlugin.extraArgs={-release-startup-pages}"}, wantRefusal: "the plugin no longer has --release-startup-pages"},
		{name: "other arguments", args: []string{"--set", "kubeletPlugin.extraArgs={--v=3,--gc-percentage=3}"}},
		{name: "the old variables", args: []string{"--set", "kubeletPlugin.extraEnv[0].name=PRISM_GC_PERCENT", "--set-string", "kubeletPlugin.extraEnv[0].value=80"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, err := helmTemplate(t, tc.args...)
			if tc.wantRefusal == "" {
				if err != nil {
					t.Errorf("helm template %v: %v\n%s", tc.args, err, stderr)
				}
				return
			}
			if err == nil || !strings.Contains(stderr, tc.wantRefusal) {
				t.Errorf("helm template %v: %v (%s), want a refusal saying %q", tc.args, err, strings.TrimSpace(stderr), tc.wantRefusal)
			}
		})
	}
}
