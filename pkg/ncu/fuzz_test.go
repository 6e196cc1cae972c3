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

package ncu

import (
	"bytes"
	"context"
	"math"
	"testing"

	"github.com/prismgpu/prism/pkg/ncu/ncutest"
)

func FuzzParse(f *testing.F) {
	ncutest.AddFixtures(f, "testdata")
	f.Add([]byte(`"ID","Metric Name","Metric Value"` + "\n" + `"0","Duration","1"`))
	f.Add([]byte("\"\n\"\"\"\n,,,"))
	f.Fuzz(func(t *testing.T, in []byte) {
		visited := 0
		rep, err := Scan(context.Background(), bytes.NewReader(in), func(l *Launch) error {
			visited++
			// What Scan passes on must be usable without further checks.
			for _, r := range required {
				if _, ok := l.Metrics[r.name]; !ok {
					t.Fatalf("launch %q lacks %s", l.ID, r.name)
				}
			}
			for name, v := range l.Metrics {
				if !known[name] {
					t.Fatalf("launch %q keeps unknown metric %q", l.ID, name)
				}
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > maxValue {
					t.Fatalf("launch %q: %s = %v", l.ID, name, v)
				}
			}
			if d := l.Metrics[MetricDuration]; d > maxLaunchNanoseconds {
				t.Fatalf("launch %q lasted %v ns", l.ID, d)
			}
			return nil
		})
		if err != nil {
			if rep != nil {
				t.Fatalf("Scan returned a report with error %v", err)
			}
			return
		}
		if rep.Launches != visited {
			t.Fatalf("report counts %d launches, %d were passed on", rep.Launches, visited)
		}
		if !bytes.Contains(in, []byte(`"`)) {
			t.Fatalf("parsed input without a CSV line: %q", in)
		}
	})
}
