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

package fleet

import (
	"slices"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
)

// UnscheduledPods selects the pods the View reads: those no node runs yet
// and that have not ended. Only their claims can wait for an allocation
// (the scheduler allocates a pod's claims before it binds the pod), so
// the Pod informer holds the cluster's backlog, not every pod. It is also
// the set of pods whose status no kubelet can write: the node authorizer
// lets a kubelet write only pods bound to its node.
func UnscheduledPods() fields.Selector {
	return fields.AndSelectors(
		fields.OneTermEqualSelector("spec.nodeName", ""),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
		fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed)),
	)
}

// TrimPod is the transform for the Pod informer that feeds the View: it
// keeps the pod's name, UID and the names of the claims that
// kube-controller-manager made from its claim templates
// (status.resourceClaimStatuses), and drops the rest of the pod.
func TrimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	out := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion}}
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName != nil {
			out.Status.ResourceClaimStatuses = append(out.Status.ResourceClaimStatuses, corev1.PodResourceClaimStatus{Name: s.Name, ResourceClaimName: s.ResourceClaimName})
		}
	}
	return out, nil
}

// podClaims are the claims made for one pod from its claim templates.
type podClaims struct {
	uid    types.UID
	claims []string // the claims' names, in the pod's namespace
}

// summarisePod reads the claims that the resourceclaim controller of
// kube-controller-manager made for the pod. It writes their names into the
// pod's status, which the pod's owner cannot write (pods/status), and the
// API server accepts an entry there only for a name in
// spec.resourceClaims; a claim's ownerReference, by contrast, is its
// creator's to write.
func summarisePod(p *corev1.Pod) podClaims {
	s := podClaims{uid: p.UID}
	for _, st := range p.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil && *st.ResourceClaimName != "" {
			s.claims = append(s.claims, *st.ResourceClaimName)
		}
	}
	return s
}

// setPod records the claims made for a pod; the load is rebuilt only when
// they changed, not on every status update of a waiting pod.
func (v *View) setPod(pod types.NamespacedName, s podClaims) {
	old, known := v.pods[pod]
	if known && old.uid == s.uid && slices.Equal(old.claims, s.claims) {
		return
	}
	if len(s.claims) == 0 {
		if !known {
			return
		}
		delete(v.pods, pod)
	} else {
		v.pods[pod] = s
	}
	v.load = nil
}

// forgetPod forgets a pod that left the informer: it was scheduled, ended
// or was deleted. A pod made since under the same name comes as an update
// of the same key, not as an add before this delete.
func (v *View) forgetPod(pod types.NamespacedName) {
	if _, known := v.pods[pod]; known {
		delete(v.pods, pod)
		v.load = nil
	}
}

// usedByOwner says whether the waiting claim's controlling pod exists, is
// the one its ownerReference names by UID, and has the claim in its
// status: whether the resourceclaim controller made it for that pod.
func (v *View) usedByOwner(c *Claim) bool {
	pod, ok := v.pods[types.NamespacedName{Namespace: c.namespace, Name: c.waiting.pod}]
	return ok && pod.uid == c.waiting.podUID && slices.Contains(pod.claims, c.name)
}
