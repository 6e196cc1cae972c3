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
	"slices"
	"strings"
	"text/tabwriter"
)

// maxVerdict keeps a table row on one terminal line; generated selectors
// are long, and the start names the attribute that failed.
const maxVerdict = 110

// WriteTable prints rows as NODE, DEVICE, PRODUCT, CLASS, ALLOCATED,
// HELD BY and VERDICT columns; PARTITION is added when a row is a MIG
// partition, and REQUEST when rows cover several requests. The verdict comes last because it is the long one.
// wide prints verdicts without shortening them.
func WriteTable(w io.Writer, rows []Row, wide bool) error {
	requests := make(map[string]bool)
	for _, r := range rows {
		requests[r.Request] = true
	}
	multi := len(requests) > 1
	mig := slices.ContainsFunc(rows, func(r Row) bool { return r.Partition != "" })
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	header := []string{"NODE", "DEVICE", "PRODUCT", "CLASS"}
	if mig {
		header = append(header, "PARTITION")
	}
	if multi {
		header = append(header, "REQUEST")
	}
	fmt.Fprintln(tw, strings.Join(append(header, "ALLOCATED", "HELD BY", "VERDICT"), "\t"))
	for _, r := range rows {
		cols := []string{r.Node, r.Device, dash(r.Product), dash(r.Class)}
		if mig {
			cols = append(cols, dash(r.Partition))
		}
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
		held := joinHolders(r.HeldBy)
		if r.Partition != "" {
			held = partitionHolders(r.HeldBy, r.Partition)
		}
		writeRow(tw, append(cols, alloc, held, v))
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

// writeRow writes one row of a table. Tabs and newlines in attribute
// values would break the columns, so they are cleaned out first.
func writeRow(w io.Writer, cols []string) {
	for i := range cols {
		cols[i] = clean(cols[i])
	}
	fmt.Fprintln(w, strings.Join(cols, "\t"))
}

func clean(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// partitionHolders is the HELD BY column of a MIG partition, which is
// never shared: "ml/job-a (3g.20gb@0)".
func partitionHolders(holders []Holder, partition string) string {
	if len(holders) == 0 {
		return "-"
	}
	parts := make([]string, len(holders))
	for i, h := range holders {
		parts[i] = fmt.Sprintf("%s (%s)", h.Claim(), partition)
	}
	return strings.Join(parts, ", ")
}
