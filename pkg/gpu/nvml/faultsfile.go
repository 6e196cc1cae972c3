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

package nvml

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/klog/v2"
)

// faultLine is one line of a faults file: an Xid on the GPU at an NVML
// index, in one of its MIG GPU instances if GPUInstance is set.
type faultLine struct {
	GPU         int     `json:"gpu"`
	XID         uint64  `json:"xid"`
	GPUInstance *uint32 `json:"gpuInstance,omitempty"`
}

// parseFaultLine reads one line. A field it does not know is an error: a
// misspelt gpuInstance would otherwise fail the whole GPU.
func parseFaultLine(line []byte) (faultLine, error) {
	var fault faultLine
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&fault); err != nil {
		return faultLine{}, fmt.Errorf("simulated fault %q: want a JSON object like {\"gpu\":0,\"xid\":48,\"gpuInstance\":1} (gpuInstance optional): %w",
			bytes.TrimSpace(line), err)
	}
	return fault, nil
}

// FollowFile injects the faults appended to the file at path until ctx
// ends, one JSON object per line such as {"gpu": 2, "xid": 48}, or {"gpu":
// 2, "xid": 48, "gpuInstance": 1} for an Xid of a MIG GPU instance, so that
// a test or the demo can make a GPU of a running plugin fail from outside.
// A file that does not exist yet is no fault.
func (f *Faults) FollowFile(ctx context.Context, path string) {
	logger := klog.FromContext(ctx)
	var offset int64
	ticker := time.NewTicker(200 * time.Millisecond)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		file, err := os.Open(path)
		if err != nil {
			continue
		}
		if _, err := file.Seek(offset, io.SeekStart); err != nil {
			file.Close()
			continue
		}
		r := bufio.NewReader(file)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				break // a partial line is read again next time
			}
			offset += int64(len(line))
			if err := f.injectLine(line); err != nil {
				logger.Error(err, "Simulated fault not raised", "file", path)
			}
		}
		file.Close()
	}
}

// injectLine raises the fault of one line of a faults file.
func (f *Faults) injectLine(line []byte) error {
	fault, err := parseFaultLine(line)
	if err != nil {
		return err
	}
	if fault.GPU < 0 || fault.GPU >= len(f.uuids) {
		return fmt.Errorf("no GPU %d: the node has %d", fault.GPU, len(f.uuids))
	}
	uuid := f.uuids[fault.GPU]
	if fault.GPUInstance != nil {
		return f.InjectInstanceXID(uuid, *fault.GPUInstance, fault.XID)
	}
	return f.InjectXID(uuid, fault.XID)
}
