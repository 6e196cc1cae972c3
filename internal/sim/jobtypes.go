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

package sim

import (
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"

	"github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/pkg/profile"
)

// jobTypesHeader is the header of the trace replay's job-types file
// (docs/simulator.md, "Your own data"), in the conventions of the
// measured-data files: CSV with a header row, # lines are comments. Its
// throughputs are the rows of a jobs.csv on the fleet's models.
var jobTypesHeader = []string{"job", "sm_pct", "mem_pct"}

// gpuNames are the fleet's models as the files name them, the names of
// jobs.csv: ModelID.String in lower case.
var gpuNames = func() (n [numModels]string) {
	for m := range numModels {
		n[m] = strings.ToLower(m.String())
	}
	return n
}()

// JobType is one training workload the trace's pods are drawn from. SMPct
// and MemPct are what an Nsight Compute speed-of-light section would report
// for it in percent of peak: the classifier's input, all Prism sees.
// Throughput is its speed alone on each GPU model: the simulator's ground
// truth, which nothing in Prism's decision path reads.
type JobType struct {
	Name          string
	SMPct, MemPct float64
	Throughput    [numModels]float64
}

// Bound is what Prism's classifier (profile.Classify, the code the
// profiling path runs on each kernel) makes of the job type's SM and
// memory figures. A job type has one pair of figures, as a workload whose
// GPU time is all in kernels of one class; its class is then theirs.
func (t JobType) Bound() v1alpha1.BoundType {
	return profile.Classify(int32(t.SMPct*1000), int32(t.MemPct*1000))
}

// Speed is how many times faster than on the reference GPU (V100) job type
// t trains on model m: the ratio of measured throughputs.
func (t JobType) Speed(m ModelID) float64 {
	return t.Throughput[m] / t.Throughput[Reference]
}

// ReadJobTypes reads the job types of the trace replay: the classifier
// input from jobTypesPath, in its row order (a seed draws types by index),
// and the throughputs from the rows of the jobs.csv at jobsPath whose GPU
// is a model of the fleet (k80, p100, v100; others are left out). Every
// job type needs a throughput on each model of the fleet and every such
// throughput a job type, so that a typo cannot silently drop a type from
// the draw. Errors name the file and the line.
func ReadJobTypes(jobsPath, jobTypesPath string) ([]JobType, error) {
	jobs, err := readCSVFile(jobsPath, ParseJobs)
	if err != nil {
		return nil, err
	}
	var rows []throughputRow
	for _, j := range jobs {
		if m := slices.Index(gpuNames[:], j.GPU); m >= 0 {
			rows = append(rows, throughputRow{job: j.Job, model: ModelID(m), throughput: j.Throughput, line: j.Line})
		}
	}
	types, err := readCSVFile(jobTypesPath, parseJobTypes)
	if err != nil {
		return nil, err
	}
	return joinJobTypes(rows, types, filepath.Base(jobsPath), filepath.Base(jobTypesPath))
}

// throughputRow is one line of jobs.csv on a model of the fleet.
type throughputRow struct {
	job        string
	model      ModelID
	throughput float64
	line       int
}

// jobTypeRow is one line of the job-types file.
type jobTypeRow struct {
	JobType
	line int
}

func parseJobTypes(r io.Reader, name string) ([]jobTypeRow, error) {
	return parseKeyedCSV(r, name, jobTypesHeader, func(c *cells) (jobTypeRow, string, string) {
		t := jobTypeRow{JobType: JobType{Name: c.text(0)}, line: c.line}
		t.SMPct = c.number(1, false, 0, 100)
		t.MemPct = c.number(2, false, 0, 100)
		return t, t.Name, fmt.Sprintf("job %q", t.Name)
	})
}

// joinJobTypes gives each job type its throughputs; the names are the
// files' for errors.
func joinJobTypes(rows []throughputRow, types []jobTypeRow, throughputsName, typesName string) ([]JobType, error) {
	if len(types) == 0 {
		return nil, fmt.Errorf("%s: no job types", typesName)
	}
	out := make([]JobType, len(types))
	index := map[string]int{}
	for i, t := range types {
		out[i] = t.JobType
		index[t.Name] = i
	}
	for _, r := range rows {
		i, ok := index[r.job]
		if !ok {
			return nil, fmt.Errorf("%s:%d: job %q has no row in %s", throughputsName, r.line, r.job, typesName)
		}
		out[i].Throughput[r.model] = r.throughput
	}
	for i, t := range types {
		for m, tp := range out[i].Throughput {
			if tp == 0 {
				return nil, fmt.Errorf("%s:%d: job %q has no throughput on gpu %q in %s", typesName, t.line, t.Name, gpuNames[m], throughputsName)
			}
		}
	}
	return out, nil
}
