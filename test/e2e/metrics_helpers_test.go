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
	for _, line := range strings.Split(string(body), "\n") {
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

func itoa(i int) string { return strconv.Itoa(i) }
