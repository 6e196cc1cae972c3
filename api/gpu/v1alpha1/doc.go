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

// Package v1alpha1 holds the opaque device configuration that users put into
// a ResourceClaim's spec.devices.config[].opaque.parameters for the
// gpu.prism.dev driver.
//
// It also holds the names the driver publishes (attributes.go): the driver
// name, and the attributes and capacities of its devices. The kubelet
// plugin that publishes them and the controller that reads them both take
// them from here.
//
// The type is never served by an API server: the kubelet plugin receives it
// as raw bytes and must decode it itself, so Decode is deliberately strict.
// A typo that silently fell back to defaults would hand a user an exclusive
// GPU when they asked for time slicing, or run a profiler they did not ask
// for.
//
// +kubebuilder:object:generate=true
// +groupName=gpu.prism.dev
package v1alpha1
