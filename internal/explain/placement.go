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
	"errors"
	"fmt"

	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Prism reads prism.dev/profile (v1alpha1.ProfileAnnotation) on the
// ResourceClaim only; the checks below catch the places people put it that
// nothing reads.

// MisplacedOnTemplate warns about a ResourceClaimTemplate that carries the
// profile annotation on its own metadata but not under spec.metadata, the
// part its claims are made from. "" when there is nothing to say.
func MisplacedOnTemplate(tmpl *resourceapi.ResourceClaimTemplate) string {
	value, ok := tmpl.Annotations[prismv1alpha1.ProfileAnnotation]
	if !ok {
		return ""
	}
	if _, inSpec := tmpl.Spec.ObjectMeta.Annotations[prismv1alpha1.ProfileAnnotation]; inSpec {
		return ""
	}
	return fmt.Sprintf("%s=%s on ResourceClaimTemplate %s's own metadata is ignored: claims are made from spec.metadata, so put it under spec.metadata.annotations",
		prismv1alpha1.ProfileAnnotation, shown(value), tmpl.Name)
}

// MisplacedOnPod warns about a pod that carries the profile annotation:
// Prism reads it from the pod's ResourceClaims, not from the pod.
func MisplacedOnPod(pod metav1.Object) string {
	value, ok := pod.GetAnnotations()[prismv1alpha1.ProfileAnnotation]
	if !ok {
		return ""
	}
	return fmt.Sprintf("%s=%s on Pod %s is ignored: put it on the ResourceClaim, or under spec.metadata.annotations of its ResourceClaimTemplate",
		prismv1alpha1.ProfileAnnotation, shown(value), pod.GetName())
}

// shown is an annotation value as a warning quotes it: a name as it is,
// anything else as prismv1alpha1.ProfileName's error does, so that a
// warning stays short whatever the value's size.
func shown(value string) string {
	var invalid *prismv1alpha1.InvalidProfileError
	if _, err := prismv1alpha1.ParseProfileName(value); errors.As(err, &invalid) {
		return invalid.Shown()
	}
	return value
}
