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

package scenario

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Print writes the results table and a verdict per scenario.
func (rs Results) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SCENARIO\tPOD\tNODE\tGPU\tCLASS\tWHY\tRESULT")
	for _, s := range rs.Scenarios {
		if len(s.Rows) == 0 {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t%s\n", s.File, verdict(s.Passed()))
		}
		for i, row := range s.Rows {
			name := s.File
			if i > 0 {
				name = ""
			}
			res := verdict(len(row.Problems) == 0)
			if row.Note != "" {
				res += " (" + row.Note + ")"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, row.Pod, row.Node, row.GPU, row.Class, row.Why, res)
		}
	}
	tw.Flush()
	fmt.Fprintln(w)
	passed := 0
	for _, s := range rs.Scenarios {
		if s.Passed() {
			passed++
		}
		fmt.Fprintf(w, "%s  %-28s %s (%s)\n", verdict(s.Passed()), s.File, s.Title, s.Duration.Round(100*time.Millisecond))
		if s.Err != nil {
			fmt.Fprintf(w, "        error: %v\n", s.Err)
		}
		for _, row := range s.Rows {
			for _, p := range row.Problems {
				fmt.Fprintf(w, "        %s: %s\n", row.Pod, p)
			}
		}
	}
	fmt.Fprintf(w, "\n%d/%d scenarios passed in %s\n", passed, len(rs.Scenarios), rs.Duration.Round(100*time.Millisecond))
}

func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}
