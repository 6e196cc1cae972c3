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

package explain

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// maxVerdict keeps a table row on one terminal line; generated selectors
// are long, and the start names the attribute that failed.
const maxVerdict = 110

// WriteTable prints rows as NODE, DEVICE, PRODUCT, CLASS, ALLOCATED,
// HELD BY and VERDICT columns; REQUEST is added when rows cover several
// requests. The verdict comes last because it is the long one.
// wide prints verdicts without shortening them.
func WriteTable(w io.Writer, rows []Row, wide bool) error {
	requests := make(map[string]bool)
	for _, r := range rows {
		requests[r.Request] = true
	}
	multi := len(requests) > 1
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	header := []string{"NODE", "DEVICE", "PRODUCT", "CLASS"}
	if multi {
		header = append(header, "REQUEST")
	}
	fmt.Fprintln(tw, strings.Join(append(header, "ALLOCATED", "HELD BY", "VERDICT"), "\t"))
	for _, r := range rows {
		cols := []string{r.Node, r.Device, dash(r.Product), dash(r.Class)}
		if multi {
			cols = append(cols, r.Request)
		}
		v := r.Verdict
		if !wide && len(v) > maxVerdict {
			v = v[:maxVerdict-3] + "..."
		}
		alloc := "-"
		if r.Allocated != "" {
			alloc = "* " + r.Allocated
		}
		cols = append(cols, alloc, joinHolders(r.HeldBy), v)
		// Tabs and newlines in attribute values would break the columns.
		for i := range cols {
			cols[i] = clean(cols[i])
		}
		fmt.Fprintln(tw, strings.Join(cols, "\t"))
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing table: %w", err)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}
