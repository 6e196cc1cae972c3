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

import "fmt"

// ParsePolicy checks a policy name, such as prism-controller's --policy,
// the cluster default for profiles that set none.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyPerformance, PolicyEconomy, PolicyLoadAware:
		return p, nil
	}
	return "", fmt.Errorf("unknown policy %q: must be %q, %q or %q", s, PolicyPerformance, PolicyEconomy, PolicyLoadAware)
}
