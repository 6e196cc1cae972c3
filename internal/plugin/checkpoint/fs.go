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

package checkpoint

import (
	"os"

	"github.com/prismgpu/prism/internal/atomicfile"
)

// fileSystem holds the steps of the snapshot's atomic rewrite, of moving a
// damaged file aside and of opening the journal, so that tests can make
// each of them fail.
type fileSystem interface {
	atomicfile.FS
	// OpenAppend opens an existing file for appending.
	OpenAppend(name string) (atomicfile.File, error)
}

type osFS struct{ atomicfile.OS }

func (osFS) OpenAppend(name string) (atomicfile.File, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	return f, nil
}
