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

var palette = []string{"#7f7f7f", "#d62728", "#8c564b", "#ff7f0e", "#9467bd", "#1f77b4", "#2ca02c", "#17becf"}

// WriteLoadSVG draws median slowdown against load, one line per policy
// with its 95 % confidence interval as error bars, on a log y axis. Prism
// policies are drawn at the given label noise; the null-speed reference
// is dashed.
func WriteLoadSVG(w io.Writer, title string, rows []*Row, noise float64) error {
	var pts []loadPoint
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if Policy(r.Policy).prism() && math.Abs(r.Noise-noise) > 1e-9 {
			continue
		}
		pts = append(pts, loadPoint{series: r.Policy, load: r.Load, v: r.Median})
		// Error bars do not stretch the axis past the means' range by
		// more than a step: a wide interval is clipped at the frame.
		lo = math.Min(lo, 0.8*r.Median.Mean)
		hi = math.Max(hi, math.Min(r.Median.Mean+r.Median.Half, 1.5*r.Median.Mean))
	}
	ly, hy := math.Floor(math.Log10(lo)*4)/4, math.Ceil(math.Log10(hi)*4)/4
	if hy <= ly {
		hy = ly + 0.25
	}
	axis := yAxis{
		label: "median slowdown (JCT / runtime alone on a V100, log)",
		at:    func(v float64) float64 { return (math.Log10(math.Max(v, 1e-9)) - ly) / (hy - ly) },
	}
	for e := math.Floor(ly); e <= math.Ceil(hy); e++ {
		for _, k := range []float64{1, 2, 5} {
			v := k * math.Pow(10, e)
			if l := math.Log10(v); l < ly || l > hy {
				continue
			}
			axis.ticks = append(axis.ticks, v)
		}
	}
	loads := distinctLoads(rows, func(r *Row) float64 { return r.Load })
	return drawLoadSVG(w, title, "target utilisation (arrivals compressed)", axis, pts, loads, "null-speed")
}

// loadPoint is one series' figure at one load.
type loadPoint struct {
	series string
	load   float64
	v      Estimate
}

// yAxis is the value axis of a plot against load: at places a value
// between 0 (the bottom) and 1 (the top), clipped to the frame; a grid
// line stands at each tick.
type yAxis struct {
	label string
	at    func(v float64) float64
	ticks []float64
}

// drawLoadSVG draws points against load, one line per series in the order
// the series first appear, with 95 % intervals as error bars; the series
// named dashed, if any, is drawn dashed. The x axis labels loads.
func drawLoadSVG(w io.Writer, title, xLabel string, axis yAxis, pts []loadPoint, loads []float64, dashed string) error {
	const (
		width, height = 760, 460
		left, right   = 70, 200
		top, bottom   = 40, 55
	)
	series := map[string][]loadPoint{}
	var names []string
	minLoad, maxLoad := math.Inf(1), math.Inf(-1)
	for _, p := range pts {
		if _, ok := series[p.series]; !ok {
			names = append(names, p.series)
		}
		series[p.series] = append(series[p.series], p)
		minLoad, maxLoad = math.Min(minLoad, p.load), math.Max(maxLoad, p.load)
	}
	if len(names) == 0 {
		return fmt.Errorf("no rows to plot")
	}
	if maxLoad <= minLoad {
		minLoad, maxLoad = minLoad-0.1, maxLoad+0.1
	}
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	x := func(load float64) float64 { return float64(left) + pw*(0.05+0.9*(load-minLoad)/(maxLoad-minLoad)) }
	y := func(v float64) float64 { return float64(top) + ph*(1-math.Min(1, math.Max(0, axis.at(v)))) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	for _, v := range axis.ticks {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), float64(left)+pw, y(v))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, num(v))
	}
	for _, load := range loads {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f%%</text>`+"\n", x(load), float64(top)+ph+18, 100*load)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", float64(left)+pw/2, height-12, escape(xLabel))
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">%s</text>`+"\n", float64(top)+ph/2, escape(axis.label))
	for i, name := range names {
		color := palette[i%len(palette)]
		dash := ""
		if name == dashed {
			dash = ` stroke-dasharray="5,4"`
		}
		var line []string
		for _, p := range series[name] {
			v := p.v
			line = append(line, fmt.Sprintf("%.1f,%.1f", x(p.load), y(v.Mean)))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n",
				x(p.load), y(v.Mean-v.Half), x(p.load), y(v.Mean+v.Half), color)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(line, " "))
		ly := top + 10 + 20*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"%s/>`+"\n", width-right+15, ly, width-right+40, ly, color, dash)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", width-right+46, ly+4, escape(name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
