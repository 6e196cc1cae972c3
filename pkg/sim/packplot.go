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
	"math"
	"strings"
)

// PackMetric picks the figure of a packing row that a plot draws.
type PackMetric struct {
	Name, Label string
	Value       func(*PackRow) Estimate
}

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
	pts := make([]loadPoint, len(rows))
	for i, r := range rows {
		pts[i] = loadPoint{series: seriesName(r.Policy, r.Noise), load: r.Load, v: m.Value(r)}
	}
	return writeLoadSVG(w, title, m.Label, pts)
}

// loadPoint is one series' figure at one load.
type loadPoint struct {
	series string
	load   float64
	v      Estimate
}

// writeLoadSVG draws figures against load, one line per series, with 95 %
// intervals as error bars, on a linear axis.
func writeLoadSVG(w io.Writer, title, label string, rows []loadPoint) error {
	const (
		width, height = 760, 460
		left, right   = 70, 200
		top, bottom   = 40, 55
	)
	series := map[string][]loadPoint{}
	var names []string
	lo, hi := 0.0, math.Inf(-1)
	minLoad, maxLoad := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if _, ok := series[r.series]; !ok {
			names = append(names, r.series)
		}
		series[r.series] = append(series[r.series], r)
		hi = math.Max(hi, r.v.Mean+r.v.Half)
		minLoad, maxLoad = math.Min(minLoad, r.load), math.Max(maxLoad, r.load)
	}
	if len(names) == 0 {
		return fmt.Errorf("no rows to plot")
	}
	if maxLoad <= minLoad {
		minLoad, maxLoad = minLoad-0.1, maxLoad+0.1
	}
	if hi <= lo {
		hi = lo + 1
	}
	hi *= 1.05
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	x := func(load float64) float64 { return float64(left) + pw*(0.05+0.9*(load-minLoad)/(maxLoad-minLoad)) }
	y := func(v float64) float64 { return float64(top) + ph*(1-math.Min(1, math.Max(0, (v-lo)/(hi-lo)))) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	step := niceStep((hi - lo) / 5)
	for v := lo; v <= hi+1e-9; v += step {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), float64(left)+pw, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, num(v))
	}
	seen := map[float64]bool{}
	for _, r := range rows {
		if !seen[r.load] {
			seen[r.load] = true
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f%%</text>`+"\n", x(r.load), float64(top)+ph+18, 100*r.load)
		}
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">load (arrival rate / what whole-GPU allocation serves)</text>`+"\n", float64(left)+pw/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, escape(label))
	for i, name := range names {
		color := palette[i%len(palette)]
		var pts []string
		for _, r := range series[name] {
			v := r.v
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(r.load), y(v.Mean)))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n",
				x(r.load), y(v.Mean-v.Half), x(r.load), y(v.Mean+v.Half), color)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", width-right+15, ly, width-right+40, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+46, ly+4, escape(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// SliceMetric picks the figure of a sizing row that a plot draws.
type SliceMetric struct {
	Name, Label string
	Value       func(*SliceRow) Estimate
}

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
	pts := make([]loadPoint, len(rows))
	for i, r := range rows {
		pts[i] = loadPoint{series: seriesName(r.Policy, r.Noise), load: r.Load, v: m.Value(r)}
	}
	return writeLoadSVG(w, title, m.Label, pts)
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
