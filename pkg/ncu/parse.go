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
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode/utf8"

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

// What one report may make Scan hold. A report is written by the profiled
// workload, so these bound the memory a tenant can make the kubelet plugin
// use, whatever the report's size: Scan keeps one record and one launch at
// a time, never the report.
const (
	// MaxLine is the longest line Scan reads. ncu's longest lines are the
	// raw page's header and demangled template kernel names, a few KiB.
	// A CSV line longer than this fails the scan; other lines (the
	// application's own output) are skipped, however long.
	MaxLine = 256 << 10
	// maxRecord bounds one CSV record, which spans lines where a quote is
	// left open: encoding/csv would otherwise read to the end of the input
	// looking for the closing quote.
	maxRecord = MaxLine
	// MaxColumns bounds the header. The raw page of every metric ncu
	// collects has a few thousand.
	MaxColumns = 16384
	// maxLogged bounds the log lines one scan writes about launches it
	// drops or values it ignores; the rest are counted.
	maxLogged = 5
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

// ErrNoTable is returned by Scan for input without a single CSV line.
var ErrNoTable = errors.New("no CSV table found in ncu output")

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

// Scan reads an ncu CSV report in either layout and calls visit with each
// launch that has every required metric, in the order ncu profiled them.
// The launch passed to visit, its Metrics included, is only valid during
// the call. Lines that are not CSV (ncu's ==PROF== messages, the
// application's own output) are skipped. Scan stops with ctx's error once
// ctx is done, and with visit's error if visit fails. On an error, visit
// may already have been called for the launches before it.
//
// Scan holds one CSV record (at most MaxLine bytes and MaxColumns fields)
// and one launch at a time, whatever the size of the input.
func Scan(ctx context.Context, r io.Reader, visit func(*Launch) error) (*Report, error) {
	in := &csvLines{ctx: ctx, r: bufio.NewReaderSize(r, MaxLine)}
	cr := csv.NewReader(in)
	// ncu's details page has a different number of fields in rule rows in
	// some versions, and kernel names can contain stray quotes.
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = true
	cr.ReuseRecord = true

	header, err := cr.Read()
	if errors.Is(err, io.EOF) {
		return nil, ErrNoTable
	}
	if err != nil {
		return nil, fmt.Errorf("reading ncu CSV header: %w", err)
	}
	if len(header) > MaxColumns {
		return nil, fmt.Errorf("ncu CSV header has %d columns, more than the %d this parser reads", len(header), MaxColumns)
	}
	header = slices.Clone(header)
	for i := range header {
		header[i] = strings.TrimSpace(header[i])
	}
	t := table{cr: cr, in: in, header: header, cols: map[string]int{}, log: newLogBudget(klog.FromContext(ctx))}
	for i, h := range header {
		if _, dup := t.cols[h]; !dup {
			t.cols[h] = i
		}
	}
	in.mark()

	var rep *Report
	switch {
	case t.has(colMetricName) && t.has(colMetricValue):
		rep, err = t.details(visit)
	case t.hasMetricColumns():
		rep, err = t.raw(visit)
	default:
		return nil, fmt.Errorf("unrecognised ncu CSV header %q: want a raw page (metric columns) or a details page (%q, %q)",
			truncate(strings.Join(header, ","), 200), colMetricName, colMetricValue)
	}
	if err != nil {
		return nil, err
	}
	t.log.summary(rep)
	rep.Version = in.version
	return rep, nil
}

// csvLines passes on the lines that start with a double quote, which is
// how every line of ncu's CSV starts, and drops the rest after looking
// for a version in them. It refuses to pass on a CSV line longer than
// MaxLine, or more than maxRecord bytes since the last complete record.
type csvLines struct {
	ctx     context.Context
	r       *bufio.Reader
	buf     []byte
	newline bool // buf lacks its newline, which comes next
	version string
	fed     int64
	marked  int64
	err     error
}

// mark notes that the CSV reader has returned a record.
func (c *csvLines) mark() { c.marked = c.fed }

func (c *csvLines) Read(p []byte) (int, error) {
	for len(c.buf) == 0 && !c.newline {
		if c.err != nil {
			return 0, c.err
		}
		if err := c.ctx.Err(); err != nil {
			c.err = err
			return 0, err
		}
		line, err := c.r.ReadSlice('\n')
		trimmed := bytes.TrimLeft(line, " \t\ufeff")
		isCSV := len(trimmed) > 0 && trimmed[0] == '"'
		if errors.Is(err, bufio.ErrBufferFull) {
			if isCSV {
				c.err = fmt.Errorf("a CSV line is longer than %d bytes", MaxLine)
				return 0, c.err
			}
			// Not CSV: drop the rest of the line, whatever its length.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = c.r.ReadSlice('\n')
			}
			c.err = err
			continue
		}
		c.err = err
		if isCSV {
			if c.fed-c.marked+int64(len(trimmed)) > maxRecord {
				c.err = fmt.Errorf("a CSV record is longer than %d bytes (a quote left open?)", maxRecord)
				return 0, c.err
			}
			c.buf = trimmed
			c.newline = trimmed[len(trimmed)-1] != '\n'
			continue
		}
		if c.version == "" {
			if m := version().FindSubmatch(line); m != nil {
				c.version = string(m[1])
			}
		}
	}
	if len(c.buf) == 0 {
		c.newline = false
		p[0] = '\n'
		c.fed++
		return 1, nil
	}
	n := copy(p, c.buf)
	c.buf = c.buf[n:]
	c.fed += int64(n)
	return n, nil
}

type table struct {
	cr     *csv.Reader
	in     *csvLines
	header []string
	cols   map[string]int
	log    *logBudget
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
// reports concatenated). The record is reused by the call after.
func (t *table) next() ([]string, error) {
	for {
		rec, err := t.cr.Read()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil, err
			}
			return nil, fmt.Errorf("reading ncu CSV: %w", err)
		}
		t.in.mark()
		if len(rec) > MaxColumns {
			return nil, fmt.Errorf("ncu CSV row has %d fields, more than the %d this parser reads", len(rec), MaxColumns)
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

// canonical returns the current name of a metric this package keeps, ""
// for any other.
func canonical(name string) string {
	if n, ok := renamed[name]; ok {
		return n
	}
	if known[name] {
		return name
	}
	return ""
}

// rawColumn is a metric column of the raw page that Scan keeps.
type rawColumn struct {
	index int
	name  string // canonical; "" for the display name
}

// raw reads the wide layout: a units row, then one row per launch.
func (t *table) raw(visit func(*Launch) error) (*Report, error) {
	rep := &Report{Layout: LayoutRaw}
	var columns []rawColumn
	for i, h := range t.header {
		switch {
		case h == metricDisplayName:
			columns = append(columns, rawColumn{index: i})
		case isMetricName(h) && canonical(h) != "":
			columns = append(columns, rawColumn{index: i, name: canonical(h)})
		}
	}
	var missing []string
	for _, r := range required {
		if !slices.ContainsFunc(columns, func(c rawColumn) bool { return c.name == r.name }) {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return nil, &MissingMetricsError{Metrics: missing}
	}

	units := make([]string, len(columns))
	l := newLaunch()
	for row := 0; ; row++ {
		rec, err := t.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if row == 0 && t.isUnitsRow(rec) {
			for j, c := range columns {
				if c.index < len(rec) {
					units[j] = rec[c.index]
				}
			}
			continue
		}
		l.reset(t.cell(rec, colID), t.cell(rec, colKernel), t.cell(rec, colDevice), t.cell(rec, colCC))
		for j, c := range columns {
			if c.index >= len(rec) {
				continue
			}
			if c.name == "" {
				if name := strings.TrimSpace(rec[c.index]); name != "" && name != "n/a" {
					l.Device = name
				}
				continue
			}
			if err := l.set(t.log, c.name, units[j], rec[c.index]); err != nil {
				return nil, err
			}
		}
		if err := rep.finish(t.log, l, visit); err != nil {
			return nil, err
		}
	}
	return rep, rep.check()
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

// details reads the long layout: one row per metric. A launch's rows are
// consecutive, as ncu prints them: a launch ends where the ID changes, or,
// without IDs, where the kernel changes or a metric comes round again.
func (t *table) details(visit func(*Launch) error) (*Report, error) {
	rep := &Report{Layout: LayoutDetails}
	l := newLaunch()
	open := false
	rows := 0
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
		same := open && l.ID == id
		if !t.has(colID) {
			same = open && l.Kernel == kernel && !l.has(name)
		}
		if !same {
			if open {
				if err := rep.finish(t.log, l, visit); err != nil {
					return nil, err
				}
			}
			if !t.has(colID) {
				id = strconv.Itoa(rows)
			}
			rows++
			l.reset(id, kernel, t.cell(rec, colDevice), t.cell(rec, colCC))
			open = true
		}
		if err := l.set(t.log, name, unit, t.cell(rec, colMetricValue)); err != nil {
			return nil, err
		}
	}
	if open {
		if err := rep.finish(t.log, l, visit); err != nil {
			return nil, err
		}
	}
	return rep, rep.check()
}

// resolve turns a details-page metric label or name into the name of a
// metric this package keeps, "" for any other.
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

func newLaunch() *Launch { return &Launch{Metrics: make(map[string]float64, len(known))} }

// reset makes l a new launch, keeping its map.
func (l *Launch) reset(id, kernel, device, cc string) {
	l.ID, l.Kernel, l.Device, l.ComputeCapability = id, kernel, device, cc
	clear(l.Metrics)
}

func (l *Launch) has(name string) bool {
	_, ok := l.Metrics[name]
	return ok
}

// set stores a metric's value in base units. A value that is not a number
// fails the parse only for a required metric: other metrics are
// informational and a bad one is not worth losing the report over.
func (l *Launch) set(log *logBudget, name, unit, value string) error {
	v, err := parseValue(value)
	if errors.Is(err, errNotMeasured) {
		return nil
	}
	isRequired := false
	for _, r := range required {
		isRequired = isRequired || r.name == name
	}
	if err == nil {
		v, err = inBaseUnits(name, unit, v)
	}
	if err != nil {
		if isRequired {
			return fmt.Errorf("launch %q (%s): metric %s: %w", truncate(l.ID, 40), truncate(l.Kernel, 80), name, err)
		}
		log.ignored(l, name, value, err)
		return nil
	}
	l.Metrics[name] = v
	return nil
}

// finish passes on a complete launch and counts an incomplete one.
func (rep *Report) finish(log *logBudget, l *Launch, visit func(*Launch) error) error {
	for _, r := range required {
		if l.has(r.name) {
			rep.measured |= 1 << requiredIndex(r.name)
		}
	}
	for _, r := range required {
		if !l.has(r.name) {
			rep.Dropped++
			log.dropped(l)
			return nil
		}
	}
	rep.Launches++
	return visit(l)
}

// check fails a report in which a required metric was measured for no
// launch, or in which no launch was complete.
func (rep *Report) check() error {
	if rep.Launches == 0 && rep.Dropped == 0 {
		return nil
	}
	var missing []string
	for i, r := range required {
		if rep.measured&(1<<i) == 0 {
			missing = append(missing, r.name)
		}
	}
	if len(missing) > 0 {
		return &MissingMetricsError{Metrics: missing}
	}
	if rep.Launches == 0 {
		return fmt.Errorf("none of the %d launches in the ncu report has every required metric measured", rep.Dropped)
	}
	return nil
}

func requiredIndex(name string) int {
	for i, r := range required {
		if r.name == name {
			return i
		}
	}
	return -1
}

// logBudget keeps the log lines about one report's launches to a few: the
// report is the tenant's, and the plugin's log is everyone's.
type logBudget struct {
	logger         klog.Logger
	drops, ignores int
}

func newLogBudget(logger klog.Logger) *logBudget { return &logBudget{logger: logger} }

func (b *logBudget) dropped(l *Launch) {
	b.drops++
	if b.drops <= maxLogged {
		b.logger.V(4).Info("Dropping ncu launch with unmeasured required metrics", "launch", truncate(l.ID, 40), "kernel", truncate(l.Kernel, 80))
	}
}

func (b *logBudget) ignored(l *Launch, name, value string, err error) {
	b.ignores++
	if b.ignores <= maxLogged {
		b.logger.V(4).Info("Ignoring unreadable ncu metric", "launch", truncate(l.ID, 40), "metric", name, "value", truncate(value, 40), "err", truncate(err.Error(), 120))
	}
}

// summary says in one line what the per-launch lines left out.
func (b *logBudget) summary(rep *Report) {
	if b.drops > 0 || b.ignores > 0 {
		b.logger.V(2).Info("Parsed ncu report with gaps", "launches", rep.Launches, "droppedLaunches", b.drops, "ignoredValues", b.ignores)
	}
}

// truncate shortens to at most n bytes, without splitting a UTF-8
// sequence, and marks the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}
