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
	"context"
	"errors"
	"fmt"
	"unique"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/prismgpu/prism/internal/controller/webhook"
)

// errPodGone is a claim whose owning pod is not there, or is another pod
// of the same name.
var errPodGone = errors.New("the claim's pod was not found")

// PodSchedulers reads which scheduler places the pod a claim was made for.
// The resourceclaim controller creates a claim from a pod's template after
// the pod, with the pod as its controlling owner, so the pod exists while
// its claim is admitted.
type PodSchedulers struct {
	// Cache is the controller's informer of unscheduled pods, trimmed
	// (see KeepSchedulerName).
	Cache client.Reader
	// CacheSynced says when Cache holds every unscheduled pod. Until then
	// the pod is listed from the API instead: Cache would wait for its
	// informer to sync, and a pod it does not hold yet may exist. Nil:
	// Cache is read from the start.
	CacheSynced *webhook.Synced
	// API reads a pod the informer has not seen yet. The chart grants list
	// and watch on pods, not get: a list by name is one key read.
	API typedcorev1.PodsGetter
}

// SchedulerOf is the spec.schedulerName of the pod that owns claim, or ""
// for a claim without an owning pod (one created by hand).
func (s PodSchedulers) SchedulerOf(ctx context.Context, claim *resourceapi.ResourceClaim) (string, error) {
	owner := metav1.GetControllerOfNoCopy(claim)
	if owner == nil || owner.APIVersion != "v1" || owner.Kind != "Pod" {
		return "", nil
	}
	if s.CacheSynced.HasSynced() {
		pod := &corev1.Pod{}
		err := s.Cache.Get(ctx, types.NamespacedName{Namespace: claim.Namespace, Name: owner.Name}, pod)
		switch {
		case err == nil && pod.UID == owner.UID:
			return pod.Spec.SchedulerName, nil
		case err != nil && !apierrors.IsNotFound(err):
			return "", fmt.Errorf("reading pod %s/%s from the informer: %w", claim.Namespace, owner.Name, err)
		}
	}
	list, err := s.API.Pods(claim.Namespace).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", owner.Name).String()})
	if err != nil {
		return "", fmt.Errorf("reading pod %s/%s: %w", claim.Namespace, owner.Name, err)
	}
	for _, p := range list.Items {
		if p.Name == owner.Name && p.UID == owner.UID {
			return p.Spec.SchedulerName, nil
		}
	}
	return "", fmt.Errorf("%w: %s/%s, uid %s", errPodGone, claim.Namespace, owner.Name, owner.UID)
}

// KeepSchedulerName wraps the transform of the Pod informer so that the
// pods it keeps carry their spec.schedulerName, which SchedulerOf reads.
// The name is interned: the pods of a cluster share a few.
func KeepSchedulerName(trim toolscache.TransformFunc) toolscache.TransformFunc {
	return func(obj any) (any, error) {
		out, err := trim(obj)
		in, ok := obj.(*corev1.Pod)
		if err != nil || !ok {
			return out, err
		}
		if kept, ok := out.(*corev1.Pod); ok {
			kept.Spec.SchedulerName = unique.Make(in.Spec.SchedulerName).Value()
		}
		return out, nil
	}
}
