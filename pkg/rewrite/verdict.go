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

package rewrite

import (
	"fmt"
	"strings"
)

// verdictName is v's name in names, the verdicts' metric label values, or
// typeName(v) for a value outside them.
func verdictName[V ~int](v V, names []string, typeName string) string {
	if v < 0 || int(v) >= len(names) {
		return fmt.Sprintf("%s(%d)", typeName, int(v))
	}
	return names[v]
}

// allVerdicts lists the n verdicts of a type, for metrics that are
// initialised with each label.
func allVerdicts[V ~int](n int) []V {
	out := make([]V, n)
	for i := range out {
		out[i] = V(i)
	}
	return out
}

// noTaker is a step's verdict and reason when the profile got its share
// or partition (what) but no request took it: optedOut where each request
// that could have taken it said so itself, noEligible otherwise.
func noTaker(whole []Untouched, optedOutCount int, noEligible, optedOut fmt.Stringer, what string) (string, string) {
	if len(whole) == 0 {
		return noEligible.String(), "no request for one GPU of class " + DeviceClassName + " could be rewritten"
	}
	reasons := make([]string, len(whole))
	for i, w := range whole {
		reasons[i] = w.Request + ": " + w.Reason
	}
	verdict := noEligible
	if optedOutCount == len(whole) {
		verdict = optedOut
	}
	return verdict.String(), "no request takes " + what + " (" + strings.Join(reasons, "; ") + ")"
}
