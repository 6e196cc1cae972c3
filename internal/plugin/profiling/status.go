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
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/klog/v2"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
)

// UpdateStatus is the one writer of a WorkloadProfile's status on the node:
// the ncu report's figures (Publisher) and the usage sampler's runs both
// go through it. It creates the profile with an empty spec when it does not
// exist (the spec is its author's; the webhook refuses the plugin any
// other), then reads it, lets update change its status and writes the
// status subresource, again on a conflict. update returns false to leave
// the profile as it is. The error is an API error worth retrying.
func UpdateStatus(ctx context.Context, c WorkloadProfiles, key types.NamespacedName, update func(*prismv1alpha1.WorkloadProfile) bool) error {
	if err := ensureExists(ctx, c, key); err != nil {
		return err
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		wp, err := c.Get(ctx, key.Namespace, key.Name)
		if err != nil {
			return err
		}
		if !update(wp) {
			return nil
		}
		return c.UpdateStatus(ctx, wp)
	})
	if err != nil {
		return fmt.Errorf("writing status of WorkloadProfile %s: %w", key, err)
	}
	return nil
}

func ensureExists(ctx context.Context, c WorkloadProfiles, key types.NamespacedName) error {
	_, err := c.Get(ctx, key.Namespace, key.Name)
	if err == nil {
		return nil
	}
	if !apierrors.IsNotFound(err) {
		return fmt.Errorf("getting WorkloadProfile %s: %w", key, err)
	}
	wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := c.Create(ctx, wp); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating WorkloadProfile %s: %w", key, err)
	}
	klog.FromContext(ctx).V(2).Info("Created WorkloadProfile")
	return nil
}
