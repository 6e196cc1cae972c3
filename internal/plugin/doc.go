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

// Package plugin is Prism's kubelet plugin: it publishes the node's GPUs as a
// ResourceSlice and prepares and unprepares claims for the kubelet, recording
// every step in a checkpoint so that a crash at any point is recovered.
//
// # Layers
//
// The package is built in layers, as kubernetes-sigs/dra-example-driver's
// driver sits over its device state. A file uses only what its own layer
// and the layers below it declare (TestLayers holds it to that):
//
//  1. The node: its GPUs and their taints under one lock (nodeGPUs), the
//     guard that serialises the work on the checkpoint (guard, with the
//     rolling update's file lock), metrics, traces and crash points.
//  2. What a claim's devices may need, each a type with a few methods that
//     also owns its CDI edits: MIG partitions (migPartitions), MPS shares
//     (mpsShares), time slices (timeSlices), a memory share's limit, and
//     profiling under ncu with its report collections (profiler).
//  3. The device state (deviceState), which plans a claim, checks it
//     against the claims already prepared, records it in the checkpoint in
//     two phases around its CDI spec, and undoes it; start-up
//     reconciliation and the stale release are its too. Beside it, the
//     pool (slicePool) lays out and publishes the ResourceSlices.
//  4. Health (healthWatch): rediscovery, Xid events, unreadable GPUs, the
//     taints' record and the kubelet's health stream; every change is
//     published through the pool.
//  5. The adapter (Driver): the kubelet's calls (kubeletplugin.DRAPlugin),
//     start and stop, and the loops that rediscover GPUs and sweep stale
//     claims. It wires the parts and holds no logic of theirs.
//
// The usage sampler is not here: package usage/sampler knows claims only as
// the device state hands them in (Track, Release).
package plugin
