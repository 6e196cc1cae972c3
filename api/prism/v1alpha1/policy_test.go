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

package v1alpha1_test

import (
	"testing"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
)

func TestParsePolicy(t *testing.T) {
	for in, wantErr := range map[string]bool{"performance": false, "economy": false, "load-aware": false, "": true, "Performance": true, "fast": true} {
		if _, err := v1alpha1.ParsePolicy(in); (err != nil) != wantErr {
			t.Errorf("ParsePolicy(%q) error %v, want error %v", in, err, wantErr)
		}
	}
}
