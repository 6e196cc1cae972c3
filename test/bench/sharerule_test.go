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

package bench

import (
	"slices"
	"testing"

	"github.com/prismgpu/prism/pkg/rewrite"
)

// TestTheShareRuleThatShipsIsTheFittedOne: of the candidate rules, the
// share-rule phase's fit on the P100 pairs chooses the one production
// applies. A change to the rule's parameters, or to the data, that makes
// another candidate pack more within the target fails here.
func TestTheShareRuleThatShipsIsTheFittedOne(t *testing.T) {
	rules := ShareRuleVariants()
	j, err := judgeShareRules(t.Context(), "../..", rules)
	if err != nil {
		t.Fatal(err)
	}
	chosen := j.choose()
	if chosen < 0 {
		t.Fatalf("no candidate meets the target on %s", ShareRuleFitGPU)
	}
	ships := slices.Index(rules, rewrite.DefaultShareRule)
	if ships < 0 {
		t.Fatalf("the rule that ships, %s, is not a candidate", rewrite.DefaultShareRule)
	}
	if chosen != ships {
		t.Errorf("the fit on %s chooses %s (goodput %.3f, worst %.3f), not the rule that ships, %s (goodput %.3f, worst %.3f)",
			ShareRuleFitGPU, rules[chosen], j.outcomes[chosen][ShareRuleFitGPU].Goodput, j.outcomes[chosen][ShareRuleFitGPU].Worst80,
			rewrite.DefaultShareRule, j.outcomes[ships][ShareRuleFitGPU].Goodput, j.outcomes[ships][ShareRuleFitGPU].Worst80)
	}
}
