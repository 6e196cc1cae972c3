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
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/atomicfile"
)

// jobFile, in a claim directory beside out/, is the plugin's: the claim's
// containers mount out/ alone.
const jobFile = "job.json"

// Job is a report to collect, publish and archive after its claim is
// unprepared. Detach writes it into the directory it sets aside, so that a
// plugin stopped before the job was done finds it at start (PendingJobs)
// and does it then: a run that finished does not lose its profile.
type Job struct {
	// Dir is the directory Detach set aside. It is not stored.
	Dir string `json:"-"`
	// Claim is the claim the report was written under.
	Claim prismv1alpha1.ClaimReference `json:"claim"`
	// Profile is the WorkloadProfile the report goes to, from
	// prismv1alpha1.ProfileAnnotation; "" keeps only the raw report.
	Profile string `json:"profile,omitempty"`
	// Device is the GPU the claim's workload ran on, as NVML named it.
	Device prismv1alpha1.ProfiledDevice `json:"device,omitzero"`
}

// PendingJobs returns the jobs in <stateDir>/profiles/collect, oldest
// first: the directories a stopped plugin set aside and did not archive.
// A directory without a readable job was set aside by an older plugin and
// is left to SweepClaimDirs.
func PendingJobs(stateDir string) ([]Job, error) {
	root := filepath.Join(stateDir, profilesDir, collectDir)
	entries, err := os.ReadDir(root)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", root, err)
	}
	var jobs []Job
	for _, e := range entries {
		if !e.IsDir() || !archiveNameRE().MatchString(e.Name()) {
			continue
		}
		dir := filepath.Join(root, e.Name())
		if job, err := readJob(dir); err == nil {
			jobs = append(jobs, job)
		}
	}
	slices.SortFunc(jobs, func(a, b Job) int { return strings.Compare(a.Dir, b.Dir) })
	return jobs, nil
}

func readJob(dir string) (Job, error) {
	data, err := os.ReadFile(filepath.Join(dir, jobFile))
	if err != nil {
		return Job{}, err
	}
	var job Job
	if err := json.Unmarshal(data, &job); err != nil {
		return Job{}, fmt.Errorf("reading %s: %w", filepath.Join(dir, jobFile), err)
	}
	job.Dir = dir
	return job, nil
}

func writeJob(dir string, job Job) error {
	data, err := json.Marshal(job)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(filepath.Join(dir, jobFile), data, 0o644)
}
