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

	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// capSysAdmin is the bit of CAP_SYS_ADMIN in the capability masks.
const capSysAdmin = 21

// permissionAdvice names the fix that stays within the profiled pod. The
// node-wide switch is named too, with its price, because an administrator
// will find it anyway.
const permissionAdvice = "add CAP_SYS_ADMIN to the profiled container's securityContext.capabilities (CDI cannot add capabilities). " +
	"Setting NVreg_RestrictProfilingToAdminUsers=0 on the node instead lets every user there read the performance counters of other users' GPU work"

// PermissionError says that ncu would fail with ERR_NVGPUCTRPERM: the
// driver restricts the counters to administrators and the process is not
// one.
type PermissionError struct {
	// Params is the driver parameter file that was read.
	Params string
}

func (e *PermissionError) Error() string {
	return fmt.Sprintf("profiling not permitted: %s has RestrictProfilingToAdminUsers: 1 and the process lacks CAP_SYS_ADMIN; %s",
		e.Params, permissionAdvice)
}

// CheckPermissions tells whether a process may read the GPU performance
// counters: the driver must not restrict them to administrators
// (<procRoot>/driver/nvidia/params), or the process must hold CAP_SYS_ADMIN
// (the effective set in <procRoot>/self/status). It returns nil when
// profiling is allowed, a *PermissionError when it is not, and another
// error when the driver's parameters cannot be read, so that the caller can
// choose to fail prepare or only warn.
//
// The capability half describes the process that reads <procRoot>/self: a
// privileged kubelet plugin checking the host's /proc learns about the
// driver from this, not about a workload's container. A plugin that wants
// to know whether a container may profile should check with a process
// inside it, or read the pod's securityContext.
func CheckPermissions(procRoot string) error {
	params := filepath.Join(procRoot, "driver", "nvidia", "params")
	restricted, err := driverRestricted(params)
	if err != nil {
		return err
	}
	if !restricted {
		return nil
	}
	capable, err := hasCapSysAdmin(filepath.Join(procRoot, "self", "status"))
	if err != nil {
		return err
	}
	if capable {
		return nil
	}
	return &PermissionError{Params: params}
}

// driverRestricted reads RestrictProfilingToAdminUsers. The driver has
// restricted profiling by default since 418.43, so a params file without
// the key counts as restricted.
func driverRestricted(path string) (bool, error) {
	value, found, err := readField(path, "NVIDIA driver parameters", "RestrictProfilingToAdminUsers")
	if err != nil {
		return false, err
	}
	if !found {
		return true, nil
	}
	v, err := strconv.Atoi(value)
	if err != nil {
		return false, fmt.Errorf("%s: RestrictProfilingToAdminUsers: %w", path, err)
	}
	return v != 0, nil
}

func hasCapSysAdmin(path string) (bool, error) {
	value, found, err := readField(path, "process capabilities", "CapEff")
	if err != nil {
		return false, err
	}
	if !found {
		return false, fmt.Errorf("%s: no CapEff line", path)
	}
	mask, err := strconv.ParseUint(value, 16, 64)
	if err != nil {
		return false, fmt.Errorf("%s: CapEff: %w", path, err)
	}
	return mask&(1<<capSysAdmin) != 0, nil
}

// readField returns the value of the first "key: value" line of the file
// at path, both trimmed, the form of the driver's params and of
// /proc/<pid>/status. what names the file in errors.
func readField(path, what, key string) (value string, found bool, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", false, fmt.Errorf("reading %s: %w", what, err)
	}
	s := bufio.NewScanner(bytes.NewReader(data))
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true, nil
		}
	}
	return "", false, nil
}

// DriverRestrictsProfiling reports whether the NVIDIA driver under procRoot
// keeps the performance counters to administrators, so that a workload can
// only be profiled with CAP_SYS_ADMIN.
func DriverRestrictsProfiling(procRoot string) (bool, error) {
	return driverRestricted(filepath.Join(procRoot, "driver", "nvidia", "params"))
}

// PodMayProfile reports whether some container of the pod may read the
// performance counters of a restricting driver: it is privileged or adds
// CAP_SYS_ADMIN. CDI cannot grant capabilities, so only the pod spec can.
func PodMayProfile(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.Containers {
		sc := c.SecurityContext
		if sc == nil {
			continue
		}
		if sc.Privileged != nil && *sc.Privileged {
			return true
		}
		if sc.Capabilities != nil {
			for _, cap := range sc.Capabilities.Add {
				if cap == "SYS_ADMIN" || cap == "CAP_SYS_ADMIN" {
					return true
				}
			}
		}
	}
	return false
}
