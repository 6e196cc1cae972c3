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

package profiling

import (
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// ValidProfile checks a profile name read back from disk (a usage record,
// the checkpoint, a report job), which a plugin that did not yet check the
// annotation at prepare may have written: an invalid one names none, and
// is logged only as the error quotes it.
func ValidProfile(logger klog.Logger, claim prismv1alpha1.ClaimReference, name string) string {
	valid, err := prismv1alpha1.ParseProfileName(name)
	if err != nil {
		logger.Info("Recorded profile of a claim is invalid: nothing of the claim is written to a WorkloadProfile", "claim", klog.KRef(claim.Namespace, claim.Name), "err", err)
	}
	return valid
}
