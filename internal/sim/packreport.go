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

package sim

import (
	"fmt"
	"io"
	"strings"
)

// WritePackingReport prints what the evaluation ran on, the table and the
// verdict: what `prismctl simulate --jobs` and `make bench` show.
func WritePackingReport(w io.Writer, d *PackingData, s PackSweep, rows []*PackRow) error {
	var profiled, heavy int
	for _, j := range d.Jobs {
		if !Known(j.UtilPct) {
			continue
		}
		profiled++
		if _, ok := SizeShare(j.UtilPct, j.MemMiB, d.MemoryKnown); !ok {
			heavy++
		}
	}
	n := len(d.Jobs)
	fmt.Fprintf(w, "Packing on %s: %d job types (%d with a utilisation figure, %d of those heavy at no noise; the rest keep a whole GPU under prism), %d pairs judged.\n",
		d.GPU, n, profiled, heavy, n*(n+1)/2)
	if len(d.Dropped) > 0 {
		left := make([]string, len(d.Dropped))
		for i, j := range d.Dropped {
			left[i] = fmt.Sprintf("%s (lacks %s: %s)", j.Job, count(len(j.Lacks), "pair"), firstFew(j.Lacks, MissingPairsNamed, ", "))
		}
		fmt.Fprintf(w, "Left out (--skip-incomplete), as the pair table lacks a pair of them: %s.\n", strings.Join(left, "; "))
	}
	if len(d.Clamped) > 0 {
		fmt.Fprintln(w, clampedLine(d.Clamped))
	}
	if d.MemoryKnown {
		fmt.Fprintf(w, "Memory: measured per job type; %d MiB per GPU.\n", int(d.MemMiB))
	} else {
		fmt.Fprintln(w, "Memory: not in the data for this GPU: no policy checks it, and a pair the judge lists as out of memory fails and reruns alone.")
	}
	fmt.Fprintf(w, "Stream: %d jobs a run (middle 60%% measured) on %d GPUs, at most 2 jobs a GPU (the judge knows pairs only); %d seeds; 95%% intervals.\n",
		s.Jobs, s.GPUs, s.Seeds)
	fmt.Fprintf(w, "Target: at most %.0f%% of jobs below 80%% of their speed alone. GPUS NEEDED: fewest GPUs serving the same stream with at most %.0f%% of jobs slowed (JCT / work alone) beyond 1.25, waiting included.\n\n",
		100*InterferenceTarget, 100*InterferenceTarget)
	return writeTableVerdict(w, rows, WritePackingTable, PackingVerdict)
}

// clampedLine says how many speeds above 1 were read as 1, and which.
func clampedLine(clamped []string) string {
	return fmt.Sprintf("Read as 1, as measurement noise (a job runs no faster beside another than alone, nor on a slice than on the whole GPU; up to %.0f%% above 1 is taken as noise): %s, %s.",
		100*SpeedTolerance, count(len(clamped), "speed"), strings.Join(clamped, "; "))
}

// count says n things, as "1 speed" or "2 speeds".
func count(n int, thing string) string {
	if n == 1 {
		return "1 " + thing
	}
	return fmt.Sprintf("%d %ss", n, thing)
}
