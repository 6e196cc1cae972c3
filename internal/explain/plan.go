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

package explain

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// PlanNote is one line of what a rewrite plan says about its choice.
type PlanNote struct {
	Label, Text string
}

// profilingNote is the annotation the webhook writes when it profiles a
// claim instead of rewriting it.
type profilingNote struct {
	Action string `json:"action"`
	Reason string `json:"reason"`
}

// PlanNotes spells out a prism.dev/rewrite annotation for a reader: how
// the claim was rewritten and why, or that it was profiled instead. Of a
// plan it gives the bound type and policy, why no ladder was written
// where none was, the hard needs, the fleet the ladder was cut from, what
// the load-aware policy decided, how the preference, the memory floor and
// the tier bounds were written, why each tier is there, and the requests
// left as written. An annotation that is neither plan nor profiling note
// is given as it is.
func PlanNotes(annotation string) []PlanNote {
	var p rewrite.Plan
	if err := json.Unmarshal([]byte(annotation), &p); err != nil || p.BoundType == "" {
		var n profilingNote
		if json.Unmarshal([]byte(annotation), &n) == nil && n.Action == "profile" {
			text := "none, this run is profiled instead"
			if n.Reason != "" {
				text += ": " + n.Reason
			}
			return []PlanNote{{"Rewrite", text}}
		}
		return []PlanNote{{"Rewrite", annotation}}
	}
	how := string(p.BoundType)
	if p.Policy != "" {
		how += " under the " + string(p.Policy) + " policy"
	}
	if len(p.Rewritten) > 0 {
		how = strings.Join(p.Rewritten, ", ") + " as " + how
	}
	notes := []PlanNote{{"Rewrite", how}}
	if p.NoLadder != "" {
		notes = append(notes, PlanNote{"Ladder", "not written: " + p.NoLadder})
	}
	if p.HardNeeds != "" {
		notes = append(notes, PlanNote{"Hard needs", p.HardNeeds})
	}
	if p.Fleet != "" {
		notes = append(notes, PlanNote{"Fleet", p.Fleet})
	}
	if p.Load != "" {
		notes = append(notes, PlanNote{"Load", p.Load})
	}
	if d := p.Preference; d != nil {
		notes = append(notes, PlanNote{"Preference", string(d.Mode) + ": " + d.Reason})
		for _, t := range d.Terms {
			notes = append(notes, PlanNote{"Node term", fmt.Sprintf("%s In [%s], weight %d (tier %s)", rewrite.ModelLabel, strings.Join(t.LabelValues(), ", "), t.Weight, t.Tier)})
		}
		if r := d.ExcludedNodes(); r != nil {
			notes = append(notes, PlanNote{"Excluded", fmt.Sprintf("%s NotIn [%s]: below the memory floor; a required term on the pod", r.Key, strings.Join(r.Values, ", "))})
		}
	}
	// Which form the controller asks for, and why: its --memory-floor and
	// the API server's answer to its probe. Where that is capacity, say
	// which form each need took: a "cel: ..." there is why the claim is
	// not the cheap one.
	if !p.Capacity.IsZero() {
		notes = append(notes, PlanNote{"Capacity requests", p.Capacity.String()})
	}
	if !p.MemoryFloor.IsZero() {
		notes = append(notes, PlanNote{"Memory floor", p.MemoryFloor.String()})
	}
	if !p.TierBounds.IsZero() {
		notes = append(notes, PlanNote{"Tier bounds", p.TierBounds.String()})
	}
	notes = append(notes, shareNotes(p.Share)...)
	notes = append(notes, partitionNotes(p.Partition, p.Share == nil || p.Share.Usage == "")...)
	for _, a := range p.Alternatives {
		notes = append(notes, PlanNote{"Tier", a.Name + ": " + a.Reason})
	}
	for _, u := range p.Untouched {
		notes = append(notes, PlanNote{"Untouched", u.Request + ": " + u.Reason})
	}
	if p.Truncated {
		notes = append(notes, PlanNote{"Note", "the plan was cut short to fit the annotation; the lists above are incomplete"})
	}
	return notes
}

// shareNotes spell out the share step: what NVML measured, the share it
// became and from which figures, or why the claim keeps whole GPUs.
func shareNotes(s *rewrite.SharePlan) []PlanNote {
	if s == nil {
		return nil
	}
	var notes []PlanNote
	if s.Usage != "" {
		notes = append(notes, PlanNote{"Usage", s.Usage})
	}
	if s.Verdict == rewrite.ShareSized.String() && s.Memory != nil {
		notes = append(notes, PlanNote{"Share", fmt.Sprintf("%d%% compute%s, %s memory first, for %s: %s", s.ComputePercent, rewrite.PeakText(s), s.Memory.String(), strings.Join(s.Requests, ", "), s.Reason)})
	} else {
		notes = append(notes, PlanNote{"Share", "none, " + s.Verdict + ": " + s.Reason})
	}
	for _, w := range s.Whole {
		notes = append(notes, PlanNote{"Whole GPU", w.Request + ": " + w.Reason})
	}
	return notes
}

// partitionNotes spell out the partition step: the MIG profiles a claim
// asks for first and from which figures, or why it keeps whole GPUs. The
// measured use is given where the share step did not give it already.
func partitionNotes(p *rewrite.PartitionPlan, usage bool) []PlanNote {
	if p == nil {
		return nil
	}
	var notes []PlanNote
	if usage && p.Usage != "" {
		notes = append(notes, PlanNote{"Usage", p.Usage})
	}
	if p.Verdict == rewrite.PartitionSized.String() {
		notes = append(notes, PlanNote{"Partition", fmt.Sprintf("%s first, for %s: %s", strings.Join(p.Profiles, ", then "), strings.Join(p.Requests, ", "), p.Reason)})
	} else {
		notes = append(notes, PlanNote{"Partition", "none, " + p.Verdict + ": " + p.Reason})
	}
	for _, w := range p.Whole {
		notes = append(notes, PlanNote{"Whole GPU", w.Request + ": " + w.Reason})
	}
	return notes
}
