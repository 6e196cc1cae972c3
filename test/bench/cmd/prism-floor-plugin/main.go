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

// Command prism-floor-plugin is a DRA kubelet plugin that does nothing but
// what every plugin on client-go's clientset and the upstream kubelet
// plugin helper does: it publishes eight devices and answers prepare with
// the allocated devices, with no CDI spec, checkpoint, metrics library or
// logging configuration. prism-bench measures its memory beside Prism's
// (--floor-plugin): the floor under any plugin built on those two. It takes
// the flags the bench gives Prism and ignores those it has no use for.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"runtime"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
)

type floor struct{}

func (floor) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		var r kubeletplugin.PrepareResult
		if c.Status.Allocation == nil {
			r.Err = errors.New("claim is not allocated")
		} else {
			for _, res := range c.Status.Allocation.Devices.Results {
				r.Devices = append(r.Devices, kubeletplugin.Device{
					Requests: []string{res.Request}, PoolName: res.Pool, DeviceName: res.Device,
					CDIDeviceIDs: []string{gpuv1alpha1.DriverName + "/floor=" + string(c.UID) + "-" + res.Device},
				})
			}
		}
		out[c.UID] = r
	}
	return out, nil
}

func (floor) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (floor) HandleError(ctx context.Context, err error, msg string) {
	klog.FromContext(ctx).Error(err, msg)
}

func (floor) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return errors.New("not offered")
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "prism-floor-plugin:", err)
		os.Exit(1)
	}
}

func run() error {
	fs := flag.NewFlagSet("prism-floor-plugin", flag.ContinueOnError)
	node := fs.String("node-name", "", "node name, also the pool name")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file")
	registrar := fs.String("kubelet-registrar-dir", "", "kubelet plugin registration directory")
	pluginDir := fs.String("kubelet-plugin-dir", "", "directory of the gRPC socket")
	addr := fs.String("http-address", "", "address of /readyz and /metrics")
	qps := fs.Float64("kube-api-qps", 200, "API client QPS")
	burst := fs.Int("kube-api-burst", 400, "API client burst")
	devices := fs.Int("devices", 8, "devices gpu-0.. to publish")
	// Prism's flags that the bench passes and a plugin without state ignores.
	for _, name := range []string{"cdi-root", "state-dir", "fleet", "v"} {
		fs.String(name, "", "ignored")
	}
	for _, name := range []string{"profiling", "consumable-capacity"} {
		fs.Bool(name, false, "ignored")
	}
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = float32(*qps), *burst
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		return err
	}
	ctx := klog.NewContext(context.Background(), klog.Background())
	helper, err := kubeletplugin.Start(ctx, floor{}, kubeletplugin.DriverName(gpuv1alpha1.DriverName), kubeletplugin.NodeName(*node),
		kubeletplugin.KubeClient(client), kubeletplugin.RegistrarDirectoryPath(*registrar), kubeletplugin.PluginDataDirectoryPath(*pluginDir))
	if err != nil {
		return err
	}
	defer helper.Stop()
	devs := make([]resourceapi.Device, *devices)
	for i := range devs {
		devs[i].Name = fmt.Sprintf("gpu-%d", i)
	}
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{*node: {Slices: []resourceslice.Slice{{Devices: devs}}}}}); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	// The one metric the bench reads of Prism, without a metrics library.
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		fmt.Fprintf(w, "go_memstats_heap_inuse_bytes %d\n", ms.HeapInuse)
	})
	return http.ListenAndServe(*addr, mux)
}
