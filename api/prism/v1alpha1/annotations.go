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

package v1alpha1

// ProfileAnnotation on a ResourceClaim names the WorkloadProfile, in the
// claim's namespace, that the rewrite webhook rewrites the claim for and
// that the kubelet plugin writes a profiled run of it to. The webhook, the
// plugin, the controller's fleet view and prismctl all read it from here.
const ProfileAnnotation = "prism.dev/profile"
