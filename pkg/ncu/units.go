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
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// errNotMeasured marks a value ncu printed as "n/a" or left empty.
var errNotMeasured = fmt.Errorf("not measured")

// thousands matches a number whose integer part is grouped by commas, the
// only way ncu uses commas in numbers; anything else with a comma (a
// decimal comma, say) is rejected rather than misread.
var thousands = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`^[+-]?[0-9]{1,3}(,[0-9]{3})+(\.[0-9]*)?([eE][+-]?[0-9]+)?$`)
})

// parseValue reads one metric value as ncu prints it.
func parseValue(s string) (float64, error) {
	s = strings.TrimSpace(s)
	switch strings.ToLower(s) {
	case "", "n/a", "na", "-":
		return 0, errNotMeasured
	}
	if strings.Contains(s, ",") {
		if !thousands().MatchString(s) {
			return 0, fmt.Errorf("invalid number %q", truncate(s, 40))
		}
		s = strings.ReplaceAll(s, ",", "")
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("invalid number %q", truncate(s, 40))
	}
	// ParseFloat accepts "NaN" and "Inf"; ncu never prints them, and they
	// would poison every weighted sum downstream.
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, fmt.Errorf("invalid number %q", truncate(s, 40))
	}
	return v, nil
}

const (
	// maxLaunchNanoseconds bounds one launch's duration. A day is far
	// beyond any kernel ncu can replay, and a million such launches still
	// sum to a finite weight.
	maxLaunchNanoseconds = 24 * 3600 * 1e9
	// maxValue bounds any other metric in base units. The largest real
	// ones, a launch's DRAM bytes or FP32 instructions, stay below 1e18;
	// with this bound every sum and product the summary makes of millions
	// of launches stays finite.
	maxValue = 1e24
)

// inBaseUnits scales a metric's value to base units and checks that it is
// one a GPU could have measured: not negative, and bounded, so that no
// sum over a report overflows into Inf or NaN.
func inBaseUnits(name, unit string, v float64) (float64, error) {
	unit = strings.TrimSpace(unit)
	if name == MetricDuration {
		if _, ok := timeUnits[unit]; !ok && unit != "" {
			return 0, fmt.Errorf("unit %q is not a time", truncate(unit, 40))
		}
	}
	v *= unitScale(unit)
	limit := maxValue
	if name == MetricDuration {
		limit = maxLaunchNanoseconds
	}
	if v < 0 || v > limit || math.IsInf(v, 0) {
		return 0, fmt.Errorf("value %g %s out of range [0, %g]", v, baseUnit(name), limit)
	}
	return v, nil
}

func baseUnit(name string) string {
	if name == MetricDuration {
		return "ns"
	}
	return "(base units)"
}

// timeUnits gives nanoseconds per unit. ncu prints the long forms
// ("usecond"); some versions and post-processors print the short ones.
var timeUnits = map[string]float64{
	"nsecond": 1, "ns": 1,
	"usecond": 1e3, "us": 1e3,
	"msecond": 1e6, "ms": 1e6,
	"second": 1e9, "s": 1e9,
}

var hertz = map[string]float64{"hz": 1, "khz": 1e3, "mhz": 1e6, "ghz": 1e9}

// prefixes are the decimal prefixes ncu puts before a unit ("Kbyte",
// "Gbyte/second"); ncu's byte prefixes are decimal, not binary.
var prefixes = map[byte]float64{'K': 1e3, 'M': 1e6, 'G': 1e9, 'T': 1e12, 'P': 1e15}

// unitScale returns the factor that takes a value printed in unit to base
// units: nanoseconds for a time, per second for a rate over time, the
// unprefixed unit otherwise. A unit it does not know scales by 1, so the
// value is kept as printed.
func unitScale(unit string) float64 {
	unit = strings.TrimSpace(unit)
	switch unit {
	case "", "%":
		return 1
	}
	if f, ok := hertz[strings.ToLower(unit)]; ok {
		return f
	}
	num, den, isRate := strings.Cut(unit, "/")
	if isRate {
		if ns, ok := timeUnits[den]; ok {
			// Per time unit: scale to per second.
			return prefixScale(num) * 1e9 / ns
		}
		// Per cycle, per thread, per block...: only the numerator scales.
		return prefixScale(num)
	}
	if ns, ok := timeUnits[num]; ok {
		return ns
	}
	return prefixScale(num)
}

// prefixScale reads a decimal prefix glued to a lower-case unit word.
func prefixScale(word string) float64 {
	if len(word) >= 2 && word[1] >= 'a' && word[1] <= 'z' {
		if f, ok := prefixes[word[0]]; ok {
			return f
		}
	}
	return 1
}
