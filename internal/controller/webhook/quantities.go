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

package webhook

import (
	"bytes"
	"fmt"
)

// Bounds on the quantities a reviewed object may hold. apimachinery's
// resource.ParseQuantity is exact: a negative decimal exponent makes it
// round through a power of ten with that many digits, and a long mantissa
// is parsed as one big number. "1e-99999999" costs minutes of CPU and
// hundreds of MiB, 100,000 digits tens of milliseconds. Every quantity
// Kubernetes stores fits an int64 with nano precision (about 30 digits,
// exponents -9 to 18), so these bounds refuse nothing an object needs.
// Measured costs are in docs/security.md ("What a review may cost").
const (
	maxQuantityExponent = 64
	maxQuantityDigits   = 128
)

// checkQuantities refuses a JSON document that holds a value
// resource.Quantity would parse at a cost beyond the bounds above. It does
// not know which fields are quantities, so it checks every string and
// number: Quantity.UnmarshalJSON takes the raw JSON value, without
// unescaping, so a value that is not quantity-shaped in its raw form costs
// nothing. It reads data once and allocates nothing; data must be valid
// JSON (the review's decoder has checked it).
func checkQuantities(data []byte) error {
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case c == '"':
			end := stringEnd(data, i+1)
			if costlyQuantity(data[i+1 : end]) {
				return costlyQuantityError(data, i+1, end)
			}
			i = end
		case c == '-' || isDigit(c):
			end := i
			for end < len(data) && isNumberByte(data[end]) {
				end++
			}
			if costlyQuantity(data[i:end]) {
				return costlyQuantityError(data, i, end)
			}
			i = end - 1
		}
	}
	return nil
}

// stringEnd returns the index of the quote that closes the string whose
// content starts at start, or len(data).
func stringEnd(data []byte, start int) int {
	for j := start; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return len(data)
}

func costlyQuantityError(data []byte, start, end int) error {
	const show = 32
	value := data[start:end]
	if len(value) > show {
		return fmt.Errorf("the value at byte %d (%q..., %d bytes) is a quantity beyond what Prism parses: more than %d digits or a decimal exponent beyond ±%d", start, value[:show], len(value), maxQuantityDigits, maxQuantityExponent)
	}
	return fmt.Errorf("the value at byte %d (%q) is a quantity beyond what Prism parses: more than %d digits or a decimal exponent beyond ±%d", start, value, maxQuantityDigits, maxQuantityExponent)
}

// costlyQuantity reports whether ParseQuantity would accept v (a raw JSON
// string's content or a number) and pay for more digits or a larger
// exponent than the bounds allow. It follows ParseQuantity's grammar:
// surrounding space (Quantity.UnmarshalJSON trims it), a sign, a number of
// digits with at most one point, and one suffix: binary SI, decimal SI, or
// e/E with a signed integer exponent.
func costlyQuantity(v []byte) bool {
	v = bytes.TrimSpace(v)
	if len(v) > 0 && (v[0] == '+' || v[0] == '-') {
		v = v[1:]
	}
	digits, points := 0, 0
	n := 0
	for ; n < len(v); n++ {
		if isDigit(v[n]) {
			digits++
		} else if v[n] == '.' {
			points++
		} else {
			break
		}
	}
	if digits == 0 || points > 1 {
		return false
	}
	suffix := v[n:]
	if len(suffix) > 1 && (suffix[0] == 'e' || suffix[0] == 'E') {
		exp := suffix[1:]
		if exp[0] == '+' || exp[0] == '-' {
			exp = exp[1:]
		}
		if len(exp) == 0 || !allDigits(exp) {
			return false
		}
		// Leading zeros are free; the magnitude is what costs.
		exp = bytes.TrimLeft(exp, "0")
		if len(exp) > 2 || (len(exp) == 2 && int(exp[0]-'0')*10+int(exp[1]-'0') > maxQuantityExponent) {
			return true
		}
	} else if !quantitySuffixes[string(suffix)] {
		return false
	}
	return digits > maxQuantityDigits
}

// quantitySuffixes are ParseQuantity's binary and decimal SI suffixes.
var quantitySuffixes = map[string]bool{
	"": true, "Ki": true, "Mi": true, "Gi": true, "Ti": true, "Pi": true, "Ei": true,
	"n": true, "u": true, "m": true, "k": true, "M": true, "G": true, "T": true, "P": true, "E": true,
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func isNumberByte(c byte) bool {
	return isDigit(c) || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E'
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if !isDigit(c) {
			return false
		}
	}
	return true
}
