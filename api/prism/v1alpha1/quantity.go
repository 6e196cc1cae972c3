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

package v1alpha1

import (
	"math/big"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// A quantity's cost is in its exponent, not its size. resource.ParseQuantity
// accepts "1E1111011110" in a few bytes, and Cmp, CmpInt64 and Value then
// compute 10^1111011110 inside inf.Dec: minutes of CPU and gigabytes of
// memory per call. For some strings ("1e-999999999", or 19 digits and a
// large exponent) ParseQuantity itself does that work. Two bounds keep a
// tenant's profile from tying up whoever reads it:
//
//   - QuantityPattern, in the CRD, keeps such strings out of the API, so
//     that nothing that decodes a WorkloadProfile (webhook, informers,
//     prismctl) ever parses one.
//   - BoundedValue, in the code, reads a quantity that did get in (a CRD
//     installed from an older manifest, a quantity built in Go) without
//     the slow path.

// MaxDeviceMemory is the most memory per device, in bytes, that a
// WorkloadProfile figure may name: 16 TiB. The largest GPU sold holds
// 288 GB and the largest memory bucket of the rewrite is 139 GiB, so this
// only rejects mistakes and attacks, with room for many GPU generations;
// and with the rewrite's headroom added it stays far inside int64.
const MaxDeviceMemory int64 = 16 << 40

// QuantityPattern is the CRD pattern of every quantity field of
// WorkloadProfile: resource.Quantity's own pattern with each digit run at
// most 32 long (an int64 needs 19, and nano precision 9 more) and a
// decimal exponent of at most two digits. Every string it admits parses
// and compares in microseconds, and every quantity Prism writes matches it.
//
// The CRD says this with a pattern, not with a CEL rule on
// quantity(self): the API server would run the same ParseQuantity and Cmp
// inside the rule, and a failed pattern does not stop CEL rules from
// running. The markers in workloadprofile_types.go repeat this string,
// next to XIntOrString, without which controller-gen refuses a pattern on
// a quantity; the schema then requires resource.Quantity's pattern and
// this one (allOf). TestCRDQuantityPattern keeps marker and constant equal.
const QuantityPattern = `^(\+|-)?(([0-9]{1,32}(\.[0-9]{0,32})?)|(\.[0-9]{1,32}))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?[0-9]{1,2}))?$`

// BoundedValue returns q rounded up to a whole number when 0 <= q <= bound,
// and otherwise an error that names path and bound.
//
// Unlike Cmp, CmpInt64, Value and even AsInt64, it never computes a power
// of ten larger than q's own digits: it reads q as unscaled × 10^-scale and
// compares magnitudes before any arithmetic, so its work does not grow
// with the exponent. q is taken by value because reading it converts the
// copy in place; the caller's quantity, often shared with an informer's
// cache, is never written.
func BoundedValue(path *field.Path, q resource.Quantity, bound int64) (int64, *field.Error) {
	// The value in the error is the string q was parsed from where
	// ParseQuantity kept it, and otherwise q in exponent form: rendering
	// BinarySI compares q with ±1024 (the slow path again), and DecimalSI
	// drops exponents it has no suffix for (10^30 reads "1").
	shown := q
	shown.Format = resource.DecimalExponent
	tooLarge := func() (int64, *field.Error) {
		return 0, field.Invalid(path, shown.String(), "must be at most "+resource.NewQuantity(bound, resource.BinarySI).String())
	}
	switch q.Sign() {
	case 0:
		return 0, nil
	case -1:
		return 0, field.Invalid(path, shown.String(), "must not be negative")
	}
	d := q.AsDec()
	u, scale := d.UnscaledBig(), int64(d.Scale())
	// 10^low <= u < 10^high, because 0.30102 < log10(2) < 0.30103.
	low := int64(u.BitLen()-1) * 30102 / 100000
	high := int64(u.BitLen())*30103/100000 + 1
	limit := int64(len(strconv.FormatInt(bound, 10))) // bound < 10^limit
	v := big.NewInt(1)
	switch {
	case low-scale >= limit: // q >= 10^(low-scale) > bound
		return tooLarge()
	case high <= scale: // 0 < q < 1, rounded up to 1
	case scale <= 0: // -scale < limit: no longer than bound's digits
		v.Mul(u, new(big.Int).Exp(big.NewInt(10), big.NewInt(-scale), nil))
	default: // scale < high: no longer than u's digits
		var rem big.Int
		v.DivMod(u, new(big.Int).Exp(big.NewInt(10), big.NewInt(scale), nil), &rem)
		if rem.Sign() != 0 {
			v.Add(v, big.NewInt(1))
		}
	}
	if !v.IsInt64() || v.Int64() > bound {
		return tooLarge()
	}
	return v.Int64(), nil
}
