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

package bench

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	"sigs.k8s.io/yaml"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// TestAdmissionFixtures: the admission phase reads its two claims from the
// claim rewrite handler's test data at run time, so a move of that data
// must fail here rather than in `make bench`; the first names no profile
// (the no-annotation path), the second names one (the rewrite path).
func TestAdmissionFixtures(t *testing.T) {
	var got []string
	for _, name := range admissionClaims {
		data, err := os.ReadFile(filepath.Join("..", "..", admissionFixtures, name))
		if err != nil {
			t.Fatal(err)
		}
		var c resourceapi.ResourceClaim
		if err := yaml.UnmarshalStrict(data, &c); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got = append(got, c.Annotations[prismv1alpha1.ProfileAnnotation])
	}
	if diff := cmp.Diff([]string{"", "train"}, got); diff != "" {
		t.Errorf("profile annotations of %v (-want +got):\n%s", admissionClaims, diff)
	}
}
