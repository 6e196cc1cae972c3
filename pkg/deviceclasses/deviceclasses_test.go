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

package deviceclasses_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/prismgpu/prism/pkg/deviceclasses"
)

func TestStatic(t *testing.T) {
	class := func(name string) *resourceapi.DeviceClass {
		return &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: name}}
	}
	s := deviceclasses.Of(class("tier"), class("gpu"), class("mig"))

	list, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range list {
		names = append(names, c.Name)
	}
	if diff := cmp.Diff([]string{"gpu", "mig", "tier"}, names); diff != "" {
		t.Errorf("List names (-want +got):\n%s", diff)
	}

	if c, err := s.Get("mig"); err != nil || c.Name != "mig" {
		t.Errorf("Get(mig) = %v, %v; want the class mig", c, err)
	}
	if _, err := s.Get("missing"); err == nil || err.Error() != "device class missing not found" {
		t.Errorf("Get(missing) error = %v, want one that names the class", err)
	}
}
