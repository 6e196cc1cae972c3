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

package testbed

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"sync"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
	"k8s.io/cri-client/pkg/util"
)

// fakeImageSize is non-zero because the kubelet's image GC divides by it.
const fakeImageSize = 1 << 20

// FakeRuntime is the upstream fake CRI runtime with two additions that a real
// kubelet needs or a test wants: it records every container config it is asked
// to create (CDI devices, env, mounts), and it gives containers an absolute log
// path. The upstream fake leaves the log path empty, and on container removal
// the kubelet then globs "*" in its working directory and deletes the matches.
type FakeRuntime struct {
	*fake.RemoteRuntime
	server *grpc.Server

	mu      sync.Mutex
	created []CreatedContainer
}

// CreatedContainer is what the kubelet asked the runtime to create.
type CreatedContainer struct {
	ID         string
	PodName    string
	Namespace  string
	Name       string
	CDIDevices []string
	Envs       map[string]string
	Mounts     []*runtimeapi.Mount
}

// StartFakeRuntime serves a fake CRI runtime and image service on a unix socket.
func StartFakeRuntime(socketPath string) (*FakeRuntime, error) {
	r := &FakeRuntime{RemoteRuntime: fake.NewFakeRemoteRuntime(), server: grpc.NewServer()}
	r.ImageService.SetFakeImageSize(fakeImageSize)
	runtimeapi.RegisterRuntimeServiceServer(r.server, r)
	runtimeapi.RegisterImageServiceServer(r.server, r)
	l, err := util.CreateListener("unix://" + socketPath)
	if err != nil {
		return nil, fmt.Errorf("listen on fake CRI socket %s: %w", socketPath, err)
	}
	r.RuntimeService.FakeStatus = &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}
	go func() { _ = r.server.Serve(l) }()
	return r, nil
}

// Stop stops serving.
func (r *FakeRuntime) Stop() { r.server.Stop() }

// CreateContainer records the request and stores an absolute log path.
func (r *FakeRuntime) CreateContainer(ctx context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	resp, err := r.RemoteRuntime.CreateContainer(ctx, req)
	if err != nil {
		return nil, err
	}
	cfg := req.GetConfig()
	logPath := filepath.Join(req.GetSandboxConfig().GetLogDirectory(), cfg.GetLogPath())
	r.RuntimeService.Lock()
	if c, ok := r.RuntimeService.Containers[resp.ContainerId]; ok {
		c.LogPath = logPath
	}
	r.RuntimeService.Unlock()

	created := CreatedContainer{
		ID:        resp.ContainerId,
		PodName:   req.GetSandboxConfig().GetMetadata().GetName(),
		Namespace: req.GetSandboxConfig().GetMetadata().GetNamespace(),
		Name:      cfg.GetMetadata().GetName(),
		Envs:      map[string]string{},
		Mounts:    cfg.GetMounts(),
	}
	for _, d := range cfg.GetCDIDevices() {
		created.CDIDevices = append(created.CDIDevices, d.GetName())
	}
	for _, kv := range cfg.GetEnvs() {
		created.Envs[kv.GetKey()] = string(kv.GetValue())
	}
	r.mu.Lock()
	r.created = append(r.created, created)
	r.mu.Unlock()
	return resp, nil
}

// Created returns the containers created for a pod, oldest first.
func (r *FakeRuntime) Created(namespace, pod string) []CreatedContainer {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []CreatedContainer
	for _, c := range r.created {
		if c.Namespace == namespace && c.PodName == pod {
			out = append(out, c)
		}
	}
	return slices.Clone(out)
}
