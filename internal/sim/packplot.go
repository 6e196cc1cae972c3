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
	"io"
	"math"
)

// Metric picks the figure of a packing or sizing row that a plot draws.
type Metric[R any] struct {
	Name, Label string
	Value       func(R) Estimate
}

// PackMetric picks the figure of a packing row that a plot draws.
type PackMetric = Metric[*PackRow]

// PackMetrics are the packing plots simulate writes.
var PackMetrics = []PackMetric{
	{"goodput", "goodput per busy GPU (sum of speeds / GPUs holding a job)", func(r *PackRow) Estimate { return r.Goodput }},
	{"below80", "share of jobs below 80 % of their speed alone", func(r *PackRow) Estimate { return r.Below80 }},
	{"median-slowdown", "median slowdown (JCT / work alone)", func(r *PackRow) Estimate { return r.Median }},
}

// WritePackingSVG draws one metric against load, one line per policy (the
// profiled policy once per noise level) with 95 % intervals as error bars,
// on a linear axis.
func WritePackingSVG(w io.Writer, title string, rows []*PackRow, m PackMetric) error {
	return writeMetricSVG[PackPolicy](w, title, rows, m)
}

// writeMetricSVG draws one metric of a packing or sizing table against
// load, one line per policy (a profiled one once per noise level).
func writeMetricSVG[P gridPolicy, R gridRow[P]](w io.Writer, title string, rows []R, m Metric[R]) error {
	pts := make([]loadPoint, len(rows))
	for i, r := range rows {
		c := r.cell()
		pts[i] = loadPoint{series: seriesName(c.policy, c.noise), load: c.load, v: m.Value(r)}
	}
	return writeLoadSVG(w, title, m.Label, pts)
}

// writeLoadSVG draws figures against load, one line per series, with 95 %
// intervals as error bars, on a linear axis.
func writeLoadSVG(w io.Writer, title, label string, pts []loadPoint) error {
	lo, hi := 0.0, math.Inf(-1)
	for _, p := range pts {
		hi = math.Max(hi, p.v.Mean+p.v.Half)
	}
	if hi <= lo {
		hi = lo + 1
	}
	hi *= 1.05
	axis := yAxis{label: label, at: func(v float64) float64 { return (v - lo) / (hi - lo) }}
	step := niceStep((hi - lo) / 5)
	for v := lo; v <= hi+1e-9; v += step {
		axis.ticks = append(axis.ticks, v)
	}
	loads := distinctLoads(pts, func(p loadPoint) float64 { return p.load })
	return drawLoadSVG(w, title, "load (arrival rate / what whole-GPU allocation serves)", axis, pts, loads, "")
}

// SliceMetric picks the figure of a sizing row that a plot draws.
type SliceMetric = Metric[*SliceRow]

// SliceMetrics are the MIG sizing plots simulate writes.
var SliceMetrics = []SliceMetric{
	{"goodput", "goodput per busy GPU (sum of speeds / GPUs holding a slice)", func(r *SliceRow) Estimate { return r.Goodput }},
	{"median-slowdown", "median slowdown (JCT / work alone on a whole GPU)", func(r *SliceRow) Estimate { return r.Median }},
	{"below80", "share of jobs below 80 % of whole-GPU speed", func(r *SliceRow) Estimate { return r.Below80 }},
	{"gpus-needed", "GPUs needed (<= 10 % of jobs slowed beyond 2x)", func(r *SliceRow) Estimate { return r.GPUsNeeded }},
}

// WriteSlicingSVG draws one metric of the sizing evaluation against load,
// one line per policy (the profiled ones once per noise level).
func WriteSlicingSVG(w io.Writer, title string, rows []*SliceRow, m SliceMetric) error {
	return writeMetricSVG[SlicePolicy](w, title, rows, m)
}

// niceStep rounds a grid step to 1, 2 or 5 times a power of ten.
func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, k := range []float64{1, 2, 5} {
		if k*p >= raw {
			return k * p
		}
	}
	return 10 * p
}
