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
	"text/tabwriter"
)

// WriteTable prints one row per mode.
func WriteTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\tjobs\tmean JCT (s)\tp99 JCT (s)\tmakespan (s)\tGPU util\tmean queue (s)\tmean speed-up\t")
	for _, r := range results {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.1f%%\t%.0f\t%.2fx\t\n",
			r.Mode, r.Jobs, r.MeanJCT, r.P99JCT, r.Makespan, 100*r.Utilisation, r.MeanQueue, r.MeanSpeed)
	}
	return tw.Flush()
}

var palette = []string{"#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"}

// WriteCDFSVG draws the JCT distribution of every mode on a log10 time
// axis, as a self-contained SVG.
func WriteCDFSVG(w io.Writer, title string, results []*Result) error {
	const (
		width, height = 720, 440
		left, right   = 70, 170
		top, bottom   = 40, 55
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range results {
		if len(r.JCTs) > 0 {
			lo = math.Min(lo, math.Max(r.JCTs[0], 1))
			hi = math.Max(hi, r.JCTs[len(r.JCTs)-1])
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 1, 10
	}
	lx, hx := math.Floor(math.Log10(lo)), math.Ceil(math.Log10(hi))
	if hx <= lx {
		hx = lx + 1
	}
	x := func(v float64) float64 {
		return float64(left) + pw*(math.Log10(math.Max(v, 1))-lx)/(hx-lx)
	}
	y := func(p float64) float64 { return float64(top) + ph*(1-p) }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="15">%s</text>`+"\n", left, escape(title))
	for e := lx; e <= hx; e++ {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x(math.Pow(10, e)), top, x(math.Pow(10, e)), y(0))
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x(math.Pow(10, e)), y(0)+18, tick(math.Pow(10, e)))
	}
	for p := 0.0; p <= 1.0001; p += 0.25 {
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y(p), float64(left)+pw, y(p))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.2f</text>`+"\n", left-6, y(p)+4, p)
	}
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="black"/>`+"\n", left, top, pw, ph)
	fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">job completion time, seconds (log scale)</text>`+"\n", float64(left)+pw/2, height-12)
	fmt.Fprintf(&b, `<text transform="translate(18 %.1f) rotate(-90)" text-anchor="middle">fraction of jobs</text>`+"\n", float64(top)+ph/2)
	for i, r := range results {
		color := palette[i%len(palette)]
		n := len(r.JCTs)
		if n > 0 {
			var pts strings.Builder
			fmt.Fprintf(&pts, "%.1f,%.1f", x(r.JCTs[0]), y(0))
			// At most ~1000 steps: the plot is 480 px wide.
			step := max(1, n/1000)
			for k := 0; k < n; k += step {
				fmt.Fprintf(&pts, " %.1f,%.1f %.1f,%.1f", x(r.JCTs[k]), y(float64(k)/float64(n)), x(r.JCTs[k]), y(float64(k+1)/float64(n)))
			}
			fmt.Fprintf(&pts, " %.1f,%.1f", x(r.JCTs[n-1]), y(1))
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, pts.String())
		}
		ly := top + 10 + 22*i
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", width-right+15, ly, width-right+40, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s (mean %s)</text>`+"\n", width-right+46, ly+4, escape(string(r.Mode)), tick(r.MeanJCT))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func tick(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.3gM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.3gk", v/1e3)
	}
	return fmt.Sprintf("%.3g", v)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;").Replace(s)
}
