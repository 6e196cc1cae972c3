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

// Package deviceclasses gives the structured allocator a fixed set of
// DeviceClasses, for evaluating claims where no informer runs: the
// simulator, the benchmarks and tests.
package deviceclasses

import (
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
)

// Static is a fixed set of DeviceClasses by name. It is the allocator's
// class lister (structured.DeviceClassLister).
type Static map[string]*resourceapi.DeviceClass

// Of makes a Static of the classes, each under its own name.
func Of(classes ...*resourceapi.DeviceClass) Static {
	s := make(Static, len(classes))
	for _, c := range classes {
		s[c.Name] = c
	}
	return s
}

// List returns the classes ordered by name, so that what reads them is
// repeatable.
func (s Static) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, 0, len(s))
	for _, c := range s {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b *resourceapi.DeviceClass) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Get returns the class of that name, or an error that names it.
func (s Static) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := s[name]; ok {
		return c, nil
	}
	return nil, fmt.Errorf("device class %s not found", name)
}
