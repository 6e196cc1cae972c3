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

package scenario

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// check compares what the pod got with its expect-* annotations.
func (r *runner) check(pod *corev1.Pod, ids []string) []string {
	var problems []string
	ann := pod.Annotations
	devs := make([]resourceapi.Device, 0, len(ids))
	for _, id := range ids {
		devs = append(devs, r.slices[id])
	}
	each := func(key string, attrName gpuv1alpha1.AttributeName) {
		want, ok := ann[prefix+key]
		if !ok {
			return
		}
		for i, d := range devs {
			if got := attr(d, attrName); got != want {
				problems = append(problems, fmt.Sprintf("%s: %s is %q, want %q", ids[i], attrName, got, want))
			}
		}
		if len(devs) == 0 {
			problems = append(problems, fmt.Sprintf("no GPU, want %s %q", attrName, want))
		}
	}
	each("expect-product", gpuv1alpha1.ProductNameAttribute)
	each("expect-class", gpuv1alpha1.BandwidthClassAttribute)
	each("expect-mig-profile", gpuv1alpha1.MIGProfileAttribute)
	if want, ok := ann[prefix+"expect-gpus"]; ok && want != strconv.Itoa(len(ids)) {
		problems = append(problems, fmt.Sprintf("got %d GPUs, want %s", len(ids), want))
	}
	if want, ok := ann[prefix+"expect-node"]; ok && want != pod.Spec.NodeName {
		problems = append(problems, fmt.Sprintf("on node %s, want %s", pod.Spec.NodeName, want))
	}
	if ann[prefix+"expect-same-nvlink-domain"] == "true" {
		var domains []string
		nodes := map[string]bool{}
		for i, d := range devs {
			domains = append(domains, attr(d, gpuv1alpha1.NVLinkDomainAttribute))
			nodes[strings.Split(ids[i], "/")[0]] = true
		}
		if len(devs) < 2 || len(uniq(domains)) != 1 || slices.Contains(domains, "") || len(nodes) != 1 {
			problems = append(problems, fmt.Sprintf("NVLink domains %v of %v, want one shared domain", domains, ids))
		}
	}
	if want, ok := ann[prefix+"expect-why"]; ok {
		claims, _ := r.podClaims(context.Background(), pod)
		var whys []string
		for _, c := range claims {
			whys = append(whys, why(pod, c))
		}
		if got := strings.Join(whys, "; "); !strings.Contains(got, want) {
			problems = append(problems, fmt.Sprintf("placement reason %q lacks %q", got, want))
		}
	}
	if want, ok := ann[prefix+"expect-not-device"]; ok {
		for _, id := range ids {
			if id == want || strings.SplitN(id, "/", 2)[1] == want {
				problems = append(problems, fmt.Sprintf("got %s, want any GPU but %s", id, want))
			}
		}
		if len(ids) == 0 {
			problems = append(problems, fmt.Sprintf("no GPU, want one other than %s", want))
		}
	}
	if want, ok := ann[prefix+"expect-memory-share"]; ok {
		problems = append(problems, r.checkMemoryShare(pod, want)...)
	}
	if want, ok := ann[prefix+"expect-config"]; ok {
		claims, _ := r.podClaims(context.Background(), pod)
		found := false
		for _, c := range claims {
			if c.Status.Allocation == nil {
				continue
			}
			for _, cfg := range c.Status.Allocation.Devices.Config {
				if cfg.Opaque != nil && bytes.Contains(cfg.Opaque.Parameters.Raw, []byte(want)) {
					found = true
				}
			}
		}
		if !found {
			problems = append(problems, fmt.Sprintf("allocation carries no opaque config with %q", want))
		}
	}
	for k := range ann {
		if strings.HasPrefix(k, prefix+"expect-") && !slices.Contains(knownExpectations, k[expectPrefixLen:]) {
			problems = append(problems, "unknown expectation "+k)
		}
	}
	return problems
}

// checkPair compares what the pod got with the expectations that name
// another pod of its step (expect-same-gpu-as, expect-different-gpu-from);
// got maps each pod to its device IDs.
func checkPair(pod string, ann map[string]string, got map[string][]string) []string {
	var problems []string
	if other, ok := ann[prefix+"expect-same-gpu-as"]; ok {
		if len(got[pod]) == 0 || !slices.Equal(got[pod], got[other]) {
			problems = append(problems, fmt.Sprintf("got %v, want the same GPU as %s %v", got[pod], other, got[other]))
		}
	}
	if other, ok := ann[prefix+"expect-different-gpu-from"]; ok {
		switch {
		case len(got[pod]) == 0 || len(got[other]) == 0:
			problems = append(problems, fmt.Sprintf("got %v, want a GPU other than %s's %v", got[pod], other, got[other]))
		default:
			for _, id := range got[pod] {
				if slices.Contains(got[other], id) {
					problems = append(problems, fmt.Sprintf("got %s, which %s has too; want a different GPU", id, other))
				}
			}
		}
	}
	return problems
}

var knownExpectations = []string{"product", "class", "gpus", "node", "same-gpu-as", "different-gpu-from", "same-nvlink-domain", "config", "why", "memory-share", "not-device", "mig-profile"}

// checkMemoryShare: every Prism device of the pod's claims is a share
// (allocation with a shareID) consuming want of gpu.prism.dev/memory.
func (r *runner) checkMemoryShare(pod *corev1.Pod, want string) []string {
	q, err := resource.ParseQuantity(want)
	if err != nil {
		return []string{fmt.Sprintf("expect-memory-share %q: %v", want, err)}
	}
	claims, err := r.podClaims(context.Background(), pod)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	n := 0
	for _, c := range claims {
		if c.Status.Allocation == nil {
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != gpuv1alpha1.DriverName {
				continue
			}
			n++
			got, ok := res.ConsumedCapacity[gpuv1alpha1.MemoryCapacity.Qualified()]
			switch {
			case res.ShareID == nil:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation has no shareID, want a %s share", res.Pool, res.Device, want))
			case !ok:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation consumes no %s, want %s", res.Pool, res.Device, gpuv1alpha1.MemoryCapacity.Qualified(), want))
			case got.Cmp(q) != 0:
				problems = append(problems, fmt.Sprintf("%s/%s: allocation consumes %s of %s, want %s", res.Pool, res.Device, got.String(), gpuv1alpha1.MemoryCapacity.Qualified(), want))
			}
		}
	}
	if n == 0 {
		problems = append(problems, "no GPU, want a "+want+" memory share")
	}
	return problems
}
