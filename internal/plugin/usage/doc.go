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

// Package usage turns what NVML shows a claim's workload using into a
// WorkloadProfile's status.usage. It is pure: the kubelet plugin samples
// NVML and persists a Run; this package aggregates the samples, merges a
// finished run into the profile, and says whether the run outgrew the
// share of a GPU it was given.
//
// # A run
//
// A Run is a few hundred bytes however long the workload runs: a histogram
// of the duty cycle in whole per cents (NVML reports whole per cents, so
// the percentiles it gives are exact), the peak memory, and sums for the
// GPM means. A claim with several GPUs pools their samples: the share a
// profile sizes is of one GPU, and the busiest GPU's figures must fit it.
//
// # Merging runs
//
// Each figure of the profile is an exponentially weighted mean over runs in
// which the newest run weighs one half, the one before a quarter, and so
// on: a workload that changed shows it after one or two runs, while one odd
// run moves the profile only half way. Peak memory is the larger of that
// mean and the newest run's peak, so that a run that grew is never sized
// below what it just held. A figure the newest run lacks (no GPM on its
// GPU) keeps its older value. Runs of fewer than MinSamples samples are not
// merged: a pod that failed at start says nothing of its workload.
package usage
