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
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"

	"k8s.io/klog/v2"
)

// Leading columns both layouts share.
const (
	colID          = "ID"
	colKernel      = "Kernel Name"
	colDevice      = "Device"
	colCC          = "CC"
	colSection     = "Section Name"
	colMetricName  = "Metric Name"
	colMetricUnit  = "Metric Unit"
	colMetricValue = "Metric Value"
)

// labels maps the labels the details page prints by default
// (--print-metric-name label) to metric names. "Memory Throughput" is
// absent: the label means a percentage in the Speed Of Light section and a
// byte rate in Memory Workload Analysis, so resolve tells them apart by
// unit.
var labels = map[string]string{
	"Compute (SM) Throughput": MetricSMThroughput,
	"DRAM Throughput":         MetricDRAMThroughput,
	"L2 Cache Throughput":     MetricL2Throughput,
	"L1/TEX Cache Throughput": MetricL1Throughput,
	"Duration":                MetricDuration,
	"Waves Per SM":            MetricWavesPerSM,
	"Achieved Occupancy":      MetricAchievedOccupancy,
	"Theoretical Occupancy":   MetricTheoreticalOccupancy,
	"SM Frequency":            MetricSMCyclesPerSecond,
}

// percentMetrics must be printed in "%"; a label that maps to one of them
// with another unit belongs to a different section and is ignored.
var percentMetrics = map[string]bool{
	MetricSMThroughput:         true,
	MetricMemoryThroughput:     true,
	MetricDRAMThroughput:       true,
	MetricL2Throughput:         true,
	MetricL1Throughput:         true,
	MetricAchievedOccupancy:    true,
	MetricTheoreticalOccupancy: true,
}

// version finds an Nsight Compute version ("2025.2.1.0") on a line that
// talks about versions or names the tool, such as `ncu --version` output
// saved above the report. Compiled on first use, as thousands: the kubelet
// plugin links this package but parses a report only when a claim is profiled.
var version = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)(?:version|nsight compute)\D{0,20}?(20[0-9]{2}\.[0-9]+(?:\.[0-9]+){0,2})`)
})

// MissingMetricsError reports required metrics that no launch in a report
// carries, typically because ncu ran without the SpeedOfLight section.
type MissingMetricsError struct {
	// Metrics are the missing metric names.
	Metrics []string
}

func (e *MissingMetricsError) Error() string {
	parts := make([]string, 0, len(e.Metrics))
	for _, m := range e.Metrics {
		for _, r := range required {
			if r.name == m {
				parts = append(parts, fmt.Sprintf("%s (%q)", m, r.label))
			}
		}
	}
	return "ncu report lacks required metrics: " + strings.Join(parts, ", ")
}

// Parse reads an ncu CSV report in either layout. Lines that are not CSV
// (ncu's ==PROF== messages, the application's own output) are skipped.
func Parse(ctx context.Context, r io.Reader) (*Report, error) {
	logger := klog.FromContext(ctx)
	in := &csvLines{r: bufio.NewReader(r)}
	cr := csv.NewReader(in)
	// ncu's details page has a different number of fields in rule rows in
	// some versions, and kernel names can contain stray quotes.
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = true

	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, errors.New("no CSV table found in ncu output")
	}
	if err != nil {
		return nil, fmt.Errorf("reading ncu CSV header: %w", err)
	}
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
	}
	t := table{cr: cr, header: header, cols: map[string]int{}}
	for i, h := range header {
		if _, dup := t.cols[h]; !dup {
			t.cols[h] = i
		}
	}

	var rep *Report
	switch {
	case t.has(colMetricName) && t.has(colMetricValue):
		rep, err = t.details(logger)
	case t.hasMetricColumns():
		rep, err = t.raw(logger)
	default:
		return nil, fmt.Errorf("unrecognised ncu CSV header %q: want a raw page (metric columns) or a details page (%q, %q)",
			truncate(strings.Join(header, ","), 200), colMetricName, colMetricValue)
	}
	if err != nil {
		return nil, err
	}
	rep.Version = in.version
	return rep, nil
}

// csvLines passes on the lines that start with a double quote, which is
// how every line of ncu's CSV starts, and drops the rest after looking
// for a version in them.
type csvLines struct {
	r       *bufio.Reader
	buf     []byte
	version string
	err     error
}

func (c *csvLines) Read(p []byte) (int, error) {
	for len(c.buf) == 0 {
		if c.err != nil {
			return 0, c.err
		}
		line, err := c.r.ReadBytes('\n')
		c.err = err
		trimmed := bytes.TrimLeft(line, " \t\ufeff")
		if len(trimmed) > 0 && trimmed[0] == '"' {
			c.buf = trimmed
			if c.buf[len(c.buf)-1] != '\n' {
				c.buf = append(c.buf, '\n')
			}
			continue
		}
		if c.version == "" {
			if m := version().FindSubmatch(line); m != nil {
				c.version = string(m[1])
			}
		}
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	return n, nil
}

type table struct {
	cr     *csv.Reader
	header []string
	cols   map[string]int
}

func (t *table) has(col string) bool {
	_, ok := t.cols[col]
	return ok
}

func (t *table) hasMetricColumns() bool {
	for _, h := range t.header {
		if isMetricName(h) {
			return true
		}
	}
	return false
}

// cell returns a record's value in a named column, "" when the column or
// the cell is missing.
func (t *table) cell(rec []string, col string) string {
	i, ok := t.cols[col]
	if !ok || i >= len(rec) {
		return ""
	}
	return strings.TrimSpace(rec[i])
}

// next returns the next record, skipping repeated headers (as in two
// reports concatenated).
func (t *table) next() ([]string, error) {
	for {
		rec, err := t.cr.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, fmt.Errorf("reading ncu CSV: %w", err)
		}
		if !sameRow(rec, t.header) {
			return rec, nil
		}
	}
}

func sameRow(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if strings.TrimSpace(a[i]) != b[i] {
			return false
		}
	}
	return true
}

func isMetricName(s string) bool { return strings.Contains(s, "__") }

func canonical(name string) string {
	if n, ok := renamed[name]; ok {
		return n
	}
	return name
}

// raw reads the wide layout: a units row, then one row per launch.
func (t *table) raw(logger klog.Logger) (*Report, error) {
	rep := &Report{Layout: LayoutRaw}
	var missing []string
	for _, r := range required {
		found := false
		for _, h := range t.header {
			if isMetricName(h) && canonical(h) == r.name {
				found = true
			}
		}
		if !found {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return nil, &MissingMetricsError{Metrics: missing}
	}

	var units []string
	var launches []*Launch
	for row := 0; ; row++ {
		rec, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if row == 0 && t.isUnitsRow(rec) {
			units = rec
			continue
		}
		l := &Launch{
			ID:                t.cell(rec, colID),
			Kernel:            t.cell(rec, colKernel),
			Device:            t.cell(rec, colDevice),
			ComputeCapability: t.cell(rec, colCC),
			Metrics:           map[string]float64{},
		}
		for i, h := range t.header {
			if !isMetricName(h) || i >= len(rec) {
				continue
			}
			if h == metricDisplayName {
				if name := strings.TrimSpace(rec[i]); name != "" && name != "n/a" {
					l.Device = name
				}
				continue
			}
			unit := ""
			if i < len(units) {
				unit = units[i]
			}
			if err := l.set(logger, canonical(h), unit, rec[i]); err != nil {
				return nil, err
			}
		}
		launches = append(launches, l)
	}
	return rep, rep.finish(logger, launches)
}

// isUnitsRow tells the units row from a launch: it leaves the leading
// columns empty and holds no numbers.
func (t *table) isUnitsRow(rec []string) bool {
	for i, h := range t.header {
		if i >= len(rec) {
			break
		}
		v := strings.TrimSpace(rec[i])
		if !isMetricName(h) && v != "" {
			return false
		}
		if _, err := parseValue(v); err == nil {
			return false
		}
	}
	return true
}

// details reads the long layout: one row per metric, grouped into launches
// by ID.
func (t *table) details(logger klog.Logger) (*Report, error) {
	rep := &Report{Layout: LayoutDetails}
	var launches []*Launch
	byID := map[string]*Launch{}
	var cur *Launch
	for {
		rec, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		label := t.cell(rec, colMetricName)
		if label == "" {
			// Rule results: a rule name and text, no metric.
			continue
		}
		unit := t.cell(rec, colMetricUnit)
		name := resolve(label, unit)
		if name == "" {
			continue
		}

		id, kernel := t.cell(rec, colID), t.cell(rec, colKernel)
		var l *Launch
		if t.has(colID) {
			l = byID[id]
		} else if cur != nil && cur.Kernel == kernel && !cur.has(name) {
			// Without IDs a launch ends when its kernel changes or a
			// metric comes round again.
			l = cur
		}
		if l == nil {
			if !t.has(colID) {
				id = strconv.Itoa(len(launches))
			}
			l = &Launch{
				ID:                id,
				Kernel:            kernel,
				Device:            t.cell(rec, colDevice),
				ComputeCapability: t.cell(rec, colCC),
				Metrics:           map[string]float64{},
			}
			byID[id] = l
			launches = append(launches, l)
		}
		cur = l
		if err := l.set(logger, name, unit, t.cell(rec, colMetricValue)); err != nil {
			return nil, err
		}
	}
	return rep, rep.finish(logger, launches)
}

// resolve turns a details-page metric label or name into a metric name,
// "" for one this package does not use.
func resolve(label, unit string) string {
	if isMetricName(label) {
		return canonical(label)
	}
	name, ok := labels[label]
	if label == "Memory Throughput" {
		ok = true
		name = MetricMemoryThroughput
		if strings.Contains(unit, "/") {
			name = MetricDRAMBytesPerSecond
		}
	}
	if !ok {
		return ""
	}
	if percentMetrics[name] && unit != "%" && unit != "" {
		return ""
	}
	return name
}

func (l *Launch) has(name string) bool {
	_, ok := l.Metrics[name]
	return ok
}

// set stores a metric's value in base units. A value that is not a number
// fails the parse only for a required metric: other metrics are
// informational and a bad one is not worth losing the report over.
func (l *Launch) set(logger klog.Logger, name, unit, value string) error {
	v, err := parseValue(value)
	if errors.Is(err, errNotMeasured) {
		return nil
	}
	isRequired := false
	for _, r := range required {
		isRequired = isRequired || r.name == name
	}
	if err == nil && name == MetricDuration {
		if _, ok := timeUnits[strings.TrimSpace(unit)]; !ok && strings.TrimSpace(unit) != "" {
			err = fmt.Errorf("unit %q is not a time", unit)
		}
	}
	if err != nil {
		if isRequired {
			return fmt.Errorf("launch %q (%s): metric %s: %w", l.ID, truncate(l.Kernel, 80), name, err)
		}
		logger.V(4).Info("Ignoring unreadable ncu metric", "launch", l.ID, "metric", name, "value", truncate(value, 80), "err", err)
		return nil
	}
	l.Metrics[name] = v * unitScale(unit)
	return nil
}

// finish checks the required metrics and keeps the complete launches.
func (rep *Report) finish(logger klog.Logger, launches []*Launch) error {
	var missing []string
	for _, r := range required {
		found := len(launches) == 0
		for _, l := range launches {
			found = found || l.has(r.name)
		}
		if !found {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return &MissingMetricsError{Metrics: missing}
	}
	for _, l := range launches {
		complete := true
		for _, r := range required {
			complete = complete && l.has(r.name)
		}
		if !complete {
			rep.Dropped++
			logger.V(2).Info("Dropping ncu launch with unmeasured required metrics", "launch", l.ID, "kernel", truncate(l.Kernel, 80))
			continue
		}
		rep.Launches = append(rep.Launches, *l)
	}
	if len(rep.Launches) == 0 && rep.Dropped > 0 {
		return fmt.Errorf("none of the %d launches in the ncu report has every required metric measured", rep.Dropped)
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
