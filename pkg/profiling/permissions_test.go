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
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckPermissions(t *testing.T) {
	tests := map[string]struct {
		wantPermission bool
		wantErr        string
	}{
		"unrestricted":     {},
		"restricted-cap":   {},
		"restricted-nocap": {wantPermission: true, wantErr: "RestrictProfilingToAdminUsers: 1 and the process lacks CAP_SYS_ADMIN"},
		// The driver has defaulted to restricted since 418.43.
		"missing-key": {wantPermission: true, wantErr: "CDI cannot add capabilities"},
		"no-driver":   {wantErr: "reading NVIDIA driver parameters"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			err := CheckPermissions(filepath.Join("testdata", "proc", name))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("CheckPermissions: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("CheckPermissions: got %v, want an error containing %q", err, tc.wantErr)
			}
			var pe *PermissionError
			if got := errors.As(err, &pe); got != tc.wantPermission {
				t.Errorf("errors.As(*PermissionError) = %v, want %v", got, tc.wantPermission)
			}
		})
	}
}
