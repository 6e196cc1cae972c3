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
	const (
		width, height = 760, 460
		left, right   = 70, 200
		top, bottom   = 40, 55
	)
	series := map[string][]*Row{}
	var names []string
	lo, hi := math.Inf(1), math.Inf(-1)
	minLoad, maxLoad := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		if Policy(r.Policy).prism() && math.Abs(r.Noise-noise) > 1e-9 {
			continue
		}
		if _, ok := series[r.Policy]; !ok {
			names = append(names, r.Policy)
		}
		series[r.Policy] = append(series[r.Policy], r)
		// Error bars do not stretch the axis past the means' range by
		// more than a step: a wide interval is clipped at the frame.
		lo = math.Min(lo, 0.8*r.Median.Mean)
		hi = math.Max(hi, math.Min(r.Median.Mean+r.Median.Half, 1.5*r.Median.Mean))
		minLoad, maxLoad = math.Min(minLoad, r.Load), math.Max(maxLoad, r.Load)
	}
	if len(names) == 0 {
		return fmt.Errorf("no rows to plot")
	}
	if maxLoad <= minLoad {
		minLoad, maxLoad = minLoad-0.1, maxLoad+0.1
	}
	ly, hy := math.Floor(math.Log10(lo)*4)/4, math.Ceil(math.Log10(hi)*4)/4
	if hy <= ly {
		hy = ly + 0.25
	}
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	x := func(load float64) float64 { return float64(left) + pw*(0.05+0.9*(load-minLoad)/(maxLoad-minLoad)) }
	y := func(v float64) float64 {
		f := (math.Log10(math.Max(v, 1e-9)) - ly) / (hy - ly)
		return float64(top) + ph*(1-math.Min(1, math.Max(0, f)))
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14">%s</text>`+"\n", left, escape(title))
	for e := math.Floor(ly); e <= math.Ceil(hy); e++ {
		for _, k := range []float64{1, 2, 5} {
			v := k * math.Pow(10, e)
			if l := math.Log10(v); l < ly || l > hy {
				continue
			}
			fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(v), float64(left)+pw, y(v))
			fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, y(v)+4, num(v))
		}
	}
	seen := map[float64]bool{}
	for _, r := range rows {
		if !seen[r.Load] {
			seen[r.Load] = true
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%.0f%%</text>`+"\n", x(r.Load), float64(top)+ph+18, 100*r.Load)
		}
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">target utilisation (arrivals compressed)</text>`+"\n", float64(left)+pw/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">median slowdown (JCT / runtime alone on a V100, log)</text>`+"\n", float64(top)+ph/2)
	for i, name := range names {
		color := palette[i%len(palette)]
		dash := ""
		if name == "null-speed" {
			dash = ` stroke-dasharray="5,4"`
		}
		var pts []string
		for _, r := range series[name] {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(r.Load), y(r.Median.Mean)))
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n",
				x(r.Load), y(r.Median.Mean-r.Median.Half), x(r.Load), y(r.Median.Mean+r.Median.Half), color)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, dash, strings.Join(pts, " "))
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
