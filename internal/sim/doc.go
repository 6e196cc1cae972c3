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

// Package sim evaluates placement policies on a public GPU cluster trace
// without judging Prism by its own yardstick: a job's true speed on a GPU
// model is a measured throughput read from a file (ReadJobTypes; the
// repository ships Gavel's, for 26 training job types on K80, P100 and
// V100), while Prism decides only from what it would see in production,
// the classifier's bound type (with label noise) and the figures the
// kubelet plugin publishes, through the admission controller's
// rewrite.Rewrite and Kubernetes' structured allocator. The trace is
// Alibaba's cluster-trace-gpu-v2023 (node and pod lists), cleaned as
// docs/simulator.md describes, replayed under a model of kube-scheduler
// with DRA, with arrivals compressed to a target load.
//
// BuildCluster lays out fleets of the built-in spec table for test/bench.
package sim
