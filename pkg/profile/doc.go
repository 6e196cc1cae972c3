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

// Package profile turns Nsight Compute measurements into a
// WorkloadProfileStatus: it aggregates kernel launches weighted by their
// GPU time, classifies each kernel with NVIDIA's speed-of-light rule,
// gives the workload the class that holds the most GPU time, and checks
// that class against the roofline model where the report allows. The
// status stores what the class is decided on (the share of GPU time of
// each class), so that ClassifyShares of a stored status gives back its
// boundType.
//
// Everything here is pure: callers (the kubelet plugin, prismctl) own the
// API writes.
package profile
