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

package claimrewrite

import (
	"fmt"
	"strings"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// shareSummary is the Shared event's word on the share: "gpu gets 30%
// compute (peaks at 45%), 8Gi memory of a shareable GPU first (duty cycle
// p50 16% p95 32%, peak memory 6Gi, 3 runs), a whole GPU after".
func shareSummary(p *rewrite.Plan) string {
	s := p.Share
	if s == nil || s.Verdict != rewrite.ShareSized.String() || s.Memory == nil {
		return ""
	}
	text := fmt.Sprintf("%s %s %d%% compute%s, %s memory of a shareable GPU first",
		strings.Join(s.Requests, ", "), verb(len(s.Requests)), s.ComputePercent, rewrite.PeakText(s), s.Memory.String())
	if s.Usage != "" {
		text += " (" + s.Usage + ")"
	}
	return text + ", a whole GPU after"
}

func verb(n int) string {
	if n == 1 {
		return "gets"
	}
	return "get"
}
