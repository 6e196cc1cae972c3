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
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

// observe waits for the pod to run and describes what it got.
func (r *runner) observe(ctx context.Context, name string) (Row, []string, *corev1.Pod) {
	row := Row{Pod: name, Node: "-", GPU: "-", Class: "-", Why: "-"}
	var pod *corev1.Pod
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, podTimeout, true, func(ctx context.Context) (bool, error) {
		p, err := r.client.CoreV1().Pods(Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		pod = p
		last = describePod(p)
		if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
			return false, fmt.Errorf("pod ended in phase %s", p.Status.Phase)
		}
		return p.Status.Phase == corev1.PodRunning, nil
	})
	if err != nil {
		row.Problems = append(row.Problems, fmt.Sprintf("not Running (%s): %v", last, err))
		return row, nil, nil
	}
	row.Node = pod.Spec.NodeName
	claims, err := r.podClaims(ctx, pod)
	if err != nil {
		row.Problems = append(row.Problems, err.Error())
		return row, nil, pod
	}
	if err := r.loadSlices(ctx); err != nil {
		row.Problems = append(row.Problems, err.Error())
		return row, nil, pod
	}
	var ids, products, classes, whys []string
	for _, c := range claims {
		if c.Status.Allocation == nil {
			row.Problems = append(row.Problems, "claim "+c.Name+" is not allocated")
			continue
		}
		for _, res := range c.Status.Allocation.Devices.Results {
			if res.Driver != gpuv1alpha1.DriverName {
				continue
			}
			id := res.Pool + "/" + res.Device
			if slices.Contains(ids, id) {
				continue
			}
			ids = append(ids, id)
			d := r.slices[id]
			products = append(products, attr(d, gpuv1alpha1.ProductNameAttribute))
			classes = append(classes, attr(d, gpuv1alpha1.BandwidthClassAttribute))
		}
		whys = append(whys, why(pod, c))
	}
	slices.Sort(ids)
	row.GPU = summarise(products)
	if len(ids) > 0 {
		var names []string
		for _, id := range ids {
			names = append(names, id[strings.Index(id, "/")+1:])
		}
		row.GPU += " [" + strings.Join(names, ",") + "]"
	}
	row.Class = strings.Join(uniq(classes), ",")
	row.Why = strings.Join(uniq(whys), "; ")
	return row, ids, pod
}

func describePod(p *corev1.Pod) string {
	s := "phase " + string(p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	return s
}

func (r *runner) podClaims(ctx context.Context, pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, prc := range pod.Spec.ResourceClaims {
		name := ""
		if prc.ResourceClaimName != nil {
			name = *prc.ResourceClaimName
		}
		for _, st := range pod.Status.ResourceClaimStatuses {
			if st.Name == prc.Name && st.ResourceClaimName != nil {
				name = *st.ResourceClaimName
			}
		}
		if name == "" {
			return nil, fmt.Errorf("pod claim %s has no ResourceClaim", prc.Name)
		}
		c, err := r.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func (r *runner) loadSlices(ctx context.Context) error {
	list, err := r.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName,
	})
	if err != nil {
		return err
	}
	r.slices = map[string]resourceapi.Device{}
	for _, s := range list.Items {
		for _, d := range s.Spec.Devices {
			r.slices[s.Spec.Pool.Name+"/"+d.Name] = d
		}
	}
	return nil
}

func attr(d resourceapi.Device, name gpuv1alpha1.AttributeName) string {
	a, ok := d.Attributes[name.Qualified()]
	switch {
	case !ok:
		return ""
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.VersionValue != nil:
		return *a.VersionValue
	case a.BoolValue != nil:
		return strconv.FormatBool(*a.BoolValue)
	}
	return ""
}

func uniq(s []string) []string {
	var out []string
	for _, v := range s {
		if v != "" && !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// summarise writes "2× NVIDIA H100 80GB HBM3" for repeated products.
func summarise(products []string) string {
	if len(products) == 0 {
		return "-"
	}
	var parts []string
	for _, p := range uniq(products) {
		n := 0
		for _, q := range products {
			if q == p {
				n++
			}
		}
		if n > 1 {
			p = fmt.Sprintf("%d× %s", n, p)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " + ")
}
