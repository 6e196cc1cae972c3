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
	corev1 "k8s.io/api/core/v1"

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

func TestPodMayProfile(t *testing.T) {
	privileged, sysAdmin := true, corev1.Capability("SYS_ADMIN")
	for _, tc := range []struct {
		name string
		sc   *corev1.SecurityContext
		want bool
	}{
		{"no security context", nil, false},
		{"privileged", &corev1.SecurityContext{Privileged: &privileged}, true},
		{"adds SYS_ADMIN", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN", sysAdmin}}}, true},
		{"other capabilities only", &corev1.SecurityContext{Capabilities: &corev1.Capabilities{Add: []corev1.Capability{"NET_ADMIN"}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a"}, {Name: "b", SecurityContext: tc.sc}}}}
			if got := PodMayProfile(pod); got != tc.want {
				t.Errorf("PodMayProfile = %v, want %v", got, tc.want)
			}
		})
	}
}
