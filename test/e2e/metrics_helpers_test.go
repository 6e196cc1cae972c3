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

package e2e

import (
	"io"

	"net/http"
	"strconv"
	"strings"
	"testing"
)

// promValue reads one sample from a Prometheus text endpoint; a series that
// is not there yet counts as 0, an endpoint that does not answer fails.
func promValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	for _, line := range scrapeMetrics(t, addr) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("parse %q: %v", line, err)
			}
			return v
		}
	}
	return 0
}

// scrapeMetrics reads the lines of a Prometheus text endpoint.
func scrapeMetrics(t *testing.T, addr string) []string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		// An unreachable endpoint must not read as "nothing counted".
		t.Fatalf("read metrics from %s: %v", addr, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(body), "\n")
}

func itoa(i int) string { return strconv.Itoa(i) }
