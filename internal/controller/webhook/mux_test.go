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

package webhook

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
)

// Each path reaches its own webhook, and the review is timed under that
// webhook's name, the label value docs/reference.md lists under "Controller metrics".
func TestMuxRoutesAndTimesEachWebhook(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	var reached []string
	handler := func(name string) http.Handler {
		return http.HandlerFunc(func(http.ResponseWriter, *http.Request) { reached = append(reached, name) })
	}
	mux := NewMux(m, nil, handler("rewriter"), handler("validator"), handler("profile writes"), handler("pod preference"))
	for _, path := range []string{RewritePath, ValidatePath, ValidatePath, ProfileWritesPath, PodPreferencePath} {
		mux.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, path, nil))
	}
	if diff := cmp.Diff([]string{"rewriter", "validator", "validator", "profile writes", "pod preference"}, reached); diff != "" {
		t.Errorf("handlers reached (-want +got):\n%s", diff)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	timed := map[string]uint64{}
	for _, f := range families {
		if f.GetName() != "prism_webhook_admission_duration_seconds" {
			continue
		}
		for _, metric := range f.GetMetric() {
			for _, l := range metric.GetLabel() {
				timed[l.GetName()+"="+l.GetValue()] = metric.GetHistogram().GetSampleCount()
			}
		}
	}
	want := map[string]uint64{"webhook=rewrite": 1, "webhook=validate": 2, "webhook=profile-writes": 1, "webhook=pod-preference": 1}
	if diff := cmp.Diff(want, timed); diff != "" {
		t.Errorf("reviews timed, by label (-want +got):\n%s", diff)
	}
}
