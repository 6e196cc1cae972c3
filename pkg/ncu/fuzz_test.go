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
	"os"
	"path/filepath"
	"testing"
)

func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.csv"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(`"ID","Metric Name","Metric Value"` + "\n" + `"0","Duration","1"`))
	f.Add([]byte("\"\n\"\"\"\n,,,"))
	f.Fuzz(func(t *testing.T, in []byte) {
		rep, err := Parse(context.Background(), bytes.NewReader(in))
		if err != nil {
			if rep != nil {
				t.Fatalf("Parse returned a report with error %v", err)
			}
			return
		}
		// What does parse must be usable without further checks.
		for _, l := range rep.Launches {
			for _, r := range required {
				v, ok := l.Metrics[r.name]
				if !ok {
					t.Fatalf("launch %q lacks %s", l.ID, r.name)
				}
				if math.IsNaN(v) || math.IsInf(v, 0) {
					t.Fatalf("launch %q: %s = %v", l.ID, r.name, v)
				}
			}
		}
		if !bytes.Contains(in, []byte(`"`)) {
			t.Fatalf("parsed input without a CSV line: %q", in)
		}
	})
}
