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

// Command prism-kubelet-plugin is Prism's DRA kubelet plugin for NVIDIA GPUs.
package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	"github.com/prismgpu/prism/internal/envflag"
	"github.com/prismgpu/prism/internal/localserve"
	"github.com/prismgpu/prism/internal/logging"
	"github.com/prismgpu/prism/internal/plugin"
	"github.com/prismgpu/prism/internal/plugin/cdi"
	"github.com/prismgpu/prism/internal/plugin/features"
	"github.com/prismgpu/prism/internal/plugin/mig"
	"github.com/prismgpu/prism/internal/plugin/mps"
	"github.com/prismgpu/prism/internal/plugin/profiling"
	"github.com/prismgpu/prism/internal/plugin/residency"
	"github.com/prismgpu/prism/internal/plugin/usage/sampler"
	"github.com/prismgpu/prism/internal/version"
	"github.com/prismgpu/prism/pkg/gpu/nvml"
)

// sweepQPS is the stale-claim sweep's own API budget.
const sweepQPS = 10

type options struct {
	nodeName, registrarDir, pluginDir, cdiRoot, driverRoot, stateDir string
	hostDriverRoot, nvidiaCDIHookPath                                string
	httpAddress, probeSocket, kubeconfig                             string
	rediscover, staleInterval, staleGrace                            time.Duration
	enableProfiling, shareMemory, figuresAsCapacity, health          bool
	ignoredXIDs                                                      string
	healthRecoverAfter                                               time.Duration
	ncuPath, shimPath, profileDirSize                                string
	profileRetention                                                 int
	kubeAPIQPS                                                       float64
	kubeAPIBurst                                                     int
	usageInterval                                                    time.Duration
	simulation                                                       simulationOptions
	logging                                                          *logging.Options
	showVersion                                                      bool
}

// gcPercent is the heap growth, in percent of the live heap, that starts a
// garbage collection. The live heap is a few MiB, so a collection costs
// well under a millisecond, and 50 rather than Go's 100 kept 2 MiB less
// resident with 500 claims (docs/plugin-performance.md). GOGC, Go's own
// variable, wins when set and not empty.
const gcPercent = 50

// envNames are the variables that predate the PRISM_<FLAG> scheme; the
// chart and existing installs set them.
var envNames = map[string]string{
	"node-name":             "NODE_NAME",
	"kubelet-registrar-dir": "KUBELET_REGISTRAR_DIRECTORY_PATH",
	"kubelet-plugin-dir":    "KUBELET_PLUGINS_DIRECTORY_PATH",
	"cdi-root":              "CDI_ROOT",
	"driver-root":           "NVIDIA_DRIVER_ROOT",
	"kubeconfig":            "KUBECONFIG",
	"v":                     "PRISM_VERBOSITY",
}

func newFlags(o *options) *pflag.FlagSet {
	flags := pflag.NewFlagSet("prism-kubelet-plugin", pflag.ContinueOnError)
	flags.StringVar(&o.nodeName, "node-name", "", "Name of this node. Required.")
	flags.StringVar(&o.registrarDir, "kubelet-registrar-dir", "/var/lib/kubelet/plugins_registry", "Kubelet plugin registration directory.")
	flags.StringVar(&o.pluginDir, "kubelet-plugin-dir", "/var/lib/kubelet/plugins/"+gpuv1alpha1.DriverName, "This driver's kubelet plugin directory, for its gRPC socket.")
	flags.StringVar(&o.cdiRoot, "cdi-root", cdi.DefaultRoot, "Directory for the per-claim CDI specs.")
	flags.StringVar(&o.driverRoot, "driver-root", "/", "Where the NVIDIA driver is installed.")
	flags.StringVar(&o.hostDriverRoot, "host-driver-root", "", "Where --driver-root is on the host, which CDI specs must name; the chart mounts host / at /driver-root. Defaults to --driver-root, as when the plugin runs in the host's mount namespace.")
	flags.StringVar(&o.nvidiaCDIHookPath, "nvidia-cdi-hook-path", cdi.DefaultNVIDIACDIHookPath, "Host path of nvidia-cdi-hook, which the container runtime runs for the driver's library links; the plugin's image copies its own there.")
	flags.StringVar(&o.stateDir, "state-dir", "/var/lib/prism", "Directory for the checkpoint.")
	flags.StringVar(&o.httpAddress, "http-address", ":8080", "Address for /metrics, /healthz and /readyz; empty disables.")
	flags.StringVar(&o.probeSocket, "probe-socket", "", "Unix socket that also serves /metrics, /healthz and /readyz, for `prism-kubelet-plugin probe` as an exec probe. On the host network two pods of a rolling update share --http-address, and the new one serves it only once the old one has gone; the socket, in the pod's own /tmp, is never shared. Empty disables.")
	flags.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig file; in-cluster configuration when empty.")
	flags.DurationVar(&o.rediscover, "rediscover-interval", time.Minute, "How often to re-read the GPUs and republish when they changed; 0 disables.")
	flags.DurationVar(&o.staleInterval, "stale-claim-interval", time.Minute, "How often prepared claims are checked against the API server; 0 disables.")
	flags.DurationVar(&o.staleGrace, "stale-claim-grace", 2*time.Minute, "How long a prepared claim must be missing from the API before its devices are released.")
	flags.BoolVar(&o.health, "health", true, "Watch NVML Xid events and taint unhealthy GPUs in the ResourceSlice.")
	flags.StringVar(&o.ignoredXIDs, "ignored-xids", joinXIDs(plugin.DefaultIgnoredXIDs), "Comma-separated Xids that are the application's fault and taint nothing.")
	flags.DurationVar(&o.healthRecoverAfter, "health-recover-after", 5*time.Minute, "How long an unhealthy GPU must stay quiet before its taint is removed; a lost GPU stays tainted until NVML reads it again.")
	flags.BoolVar(&o.shareMemory, "consumable-capacity", false, "Publish GPUs shareable by memory: claims may request a slice of a GPU's memory.")
	flags.BoolVar(&o.figuresAsCapacity, "figures-as-capacity", false, "Also publish memoryBandwidthGBps, fp32GFLOPS and smVersion (the compute capability as nvcc's sm_XY number) as capacities of GPUs that are not shareable, for the tier bounds the controller writes as capacity requests with --memory-floor=capacity. Each capacity adds to what every CEL evaluation of the device builds, so leave it off otherwise.")
	flags.DurationVar(&o.usageInterval, "usage-interval", plugin.DefaultUsageInterval, "How often NVML is sampled for the GPUs of prepared claims, whose runs are merged into their WorkloadProfile's status.usage at unprepare; 0 disables.")
	flags.BoolVar(&o.enableProfiling, "profiling", true, "Allow claims to ask for an Nsight Compute run.")
	flags.StringVar(&o.ncuPath, "ncu-path", "", "Host directory of the Nsight Compute install holding the ncu launcher.")
	flags.StringVar(&o.shimPath, "profiling-shim", "/usr/lib/prism/libprism-profile.so", "Host path of the compiled profiling preload shim; built into --state-dir with gcc when missing.")
	flags.IntVar(&o.profileRetention, "profile-retention", 20, "How many raw ncu reports to keep on the node.")
	flags.StringVar(&o.profileDirSize, "profile-dir-size", resource.NewQuantity(profiling.DefaultDirSize, resource.BinarySI).String(), "Size of the tmpfs a profiled claim's containers write their report to; 0 leaves the report directory on --state-dir's file system, unbounded. Mounting needs a privileged plugin.")
	flags.Float64Var(&o.kubeAPIQPS, "kube-api-qps", 200, "QPS towards the API server for kubelet calls: every claim the kubelet prepares costs one GET. The driver holds its lock about 2 ms per prepare, so it can take a few hundred a second; a lower limit would make a node starting many pods at once wait for the limiter rather than for the plugin. The stale-claim sweep has a separate, fixed budget of "+strconv.Itoa(sweepQPS)+" QPS.")
	flags.IntVar(&o.kubeAPIBurst, "kube-api-burst", 400, "Burst towards the API server for kubelet calls: covers the claims of a full node's pods (110 pods, some with several claims) starting at once.")
	o.simulation.addFlags(flags)
	// Prism's gates share --feature-gates with the logging gates.
	o.logging = logging.NewOptions(features.AddFeatureGates)
	o.logging.AddFlags(flags)
	flags.BoolVar(&o.showVersion, "version", false, "Print the build information and exit.")
	envflag.Bind(flags, "PRISM_", envNames, "version")
	return flags
}

func main() {
	mps.RunLauncher()
	if len(os.Args) > 1 && os.Args[1] == probeCommand {
		os.Exit(probeMain(os.Args[2:], os.Stderr, os.LookupEnv))
	}
	var o options
	flags := newFlags(&o)
	envflag.ParseCommandLine(flags)
	if o.showVersion {
		fmt.Println("prism-kubelet-plugin", version.Get())
		return
	}
	envflag.ExitIfInvalid(flags, o.logging.Apply())
	envflag.ExitIfInvalid(flags, o.simulation.validate(os.LookupEnv))
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	logging.Run("prism-kubelet-plugin", func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if o.nodeName == "" {
		return errors.New("--node-name (or NODE_NAME) is required")
	}
	// Probes first: NVML, the kubelet and the API server can each hold up
	// start-up, and the startup probe must see a live process meanwhile.
	metrics := plugin.NewMetrics()
	probes := &plugin.Probes{}
	serveHTTP(ctx, o.httpAddress, o.probeSocket, probes, metrics)
	restConfig, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	restConfig.QPS, restConfig.Burst = float32(o.kubeAPIQPS), o.kubeAPIBurst
	// Built-in types only, so protobuf, as the kubelet's own client: the
	// claim GET of every prepare costs the API server and the plugin less
	// to encode and decode. The WorkloadProfile client keeps JSON.
	kubeConfig := rest.CopyConfig(restConfig)
	kubeConfig.ContentType = runtime.ContentTypeProtobuf
	kubeConfig.AcceptContentTypes = runtime.ContentTypeProtobuf + "," + runtime.ContentTypeJSON
	// The sweep GETs every prepared claim each --stale-claim-interval: on a
	// node with a thousand claims, sharing the kubelet calls' limiter would
	// make a prepare wait behind the whole sweep.
	sweepConfig := rest.CopyConfig(kubeConfig)
	sweepConfig.QPS, sweepConfig.Burst = sweepQPS, sweepQPS
	sweepClient, err := kubernetes.NewForConfig(sweepConfig)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}
	// Traced, so that a prepare's timing at -v=4 says how long its claim
	// GET waited for a token and how long the API server took.
	kubeConfig.RateLimiter = plugin.TracedRateLimiter(flowcontrol.NewTokenBucketRateLimiter(kubeConfig.QPS, kubeConfig.Burst))
	kubeConfig.Wrap(plugin.TracedTransport)
	client, err := kubernetes.NewForConfig(kubeConfig)
	if err != nil {
		return fmt.Errorf("create Kubernetes client: %w", err)
	}

	roots := cdi.Roots{DriverRoot: o.hostDriverRoot, ContainerDriverRoot: o.driverRoot}
	if o.hostDriverRoot == "" {
		roots.DriverRoot = o.driverRoot
	}
	gpus, err := simulatedGPUs(ctx, o, roots)
	if err != nil {
		return err
	}
	if gpus == nil {
		if gpus, err = nvmlGPUs(ctx, o, roots); err != nil {
			return err
		}
	}
	writer, err := cdi.NewWriter(cdi.Options{Root: o.cdiRoot, Source: gpus.source, Roots: gpus.roots})
	if err != nil {
		return err
	}

	var profilingConfig *plugin.ProfilingConfig
	if o.enableProfiling {
		if profilingConfig, err = setUpProfiling(ctx, o, restConfig); err != nil {
			return err
		}
	}

	usage, err := setUpUsage(o, restConfig, gpus.nvml)
	if err != nil {
		return err
	}

	var health *plugin.HealthConfig
	if o.health {
		ignored, err := parseXIDs(o.ignoredXIDs)
		if err != nil {
			return err
		}
		health = &plugin.HealthConfig{NVML: gpus.nvml, IgnoredXIDs: ignored, RecoverAfter: o.healthRecoverAfter}
	}

	mpsPods, procRoot, err := mpsInPods(ctx, client, gpus.roots.DriverRoot)
	if err != nil {
		return err
	}

	driver, err := plugin.Start(ctx, plugin.Config{
		NodeName:            o.nodeName,
		KubeClient:          client,
		SweepClient:         sweepClient,
		RegistrarDir:        o.registrarDir,
		PluginDir:           o.pluginDir,
		StateDir:            o.stateDir,
		Inventory:           gpus.inventory,
		StaleClaimInterval:  o.staleInterval,
		StaleClaimGrace:     o.staleGrace,
		Profiling:           profilingConfig,
		Usage:               usage,
		MIG:                 gpus.mig,
		ShareMemory:         o.shareMemory,
		FiguresAsCapacity:   o.figuresAsCapacity,
		MIGPartitions:       o.logging.FeatureGate().Enabled(features.MIGPartitions),
		Health:              health,
		TimeSlicer:          gpus.slicer,
		MPSDriverRoot:       gpus.roots.ContainerDriverRoot,
		MPSPods:             mpsPods,
		MPSProcRoot:         procRoot,
		CDI:                 writer,
		RediscoverInterval:  o.rediscover,
		RollingUpdatePodUID: types.UID(os.Getenv("POD_UID")),
		Metrics:             metrics,
		Probes:              probes,
	})
	if err != nil {
		return err
	}
	defer driver.Stop()
	// Start-up leaves a few MiB of garbage (client-go's scheme, discovery,
	// the first slice), which an idle plugin would keep resident until its
	// heap next reached the collector's goal: collect it and return it to
	// the kernel once.
	debug.FreeOSMemory()
	// The file-backed counterpart: what only start-up ran of the executable
	// leaves memory too (idle 46 MiB resident without, 23 with, in the
	// bench), for a few milliseconds on the first calls after start.
	releaseStartupPages(ctx)
	<-ctx.Done()
	klog.FromContext(ctx).Info("Shutting down")
	return nil
}

// gpus are the node's GPUs as the plugin reads and drives them.
type gpus struct {
	inventory nvml.Inventory
	// nvml serves the health watch and the usage sampler.
	nvml   gonvml.Interface
	mig    mig.Interface
	slicer plugin.TimeSlicer
	source cdi.EditSource
	roots  cdi.Roots
}

// nvmlGPUs are the GPUs NVML finds under the driver root.
func nvmlGPUs(ctx context.Context, o options, roots cdi.Roots) (*gpus, error) {
	lib, err := nvml.New(ctx, o.driverRoot)
	if err != nil {
		return nil, err
	}
	sysfs, _ := os.DirFS("/sys").(fs.ReadLinkFS)
	source, err := cdi.NewNVMLSource(ctx, cdi.NVMLOptions{Roots: roots, NVIDIACDIHookPath: o.nvidiaCDIHookPath})
	if err != nil {
		return nil, err
	}
	return &gpus{
		inventory: nvml.NewNVMLInventory(lib, sysfs),
		nvml:      lib,
		mig:       mig.New(lib),
		slicer:    plugin.NewNvidiaSMI(o.driverRoot),
		source:    source,
		roots:     roots,
	}, nil
}

// serveHTTP serves the metrics and probes on the TCP address and on the
// probe socket, each when set, in the background. Neither failing stops the
// plugin: prepares matter more than metrics. The probe socket is bound
// before returning, so that an exec probe never finds it missing once the
// plugin has started.
func serveHTTP(ctx context.Context, addr, socket string, probes *plugin.Probes, metrics *plugin.Metrics) {
	logger := klog.FromContext(ctx)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	probes.Register(mux)
	if socket != "" {
		if l, err := localserve.ListenUnix(ctx, socket); err != nil {
			logger.Error(err, "Serving the probe socket; exec probes will fail")
		} else {
			go func() {
				if err := localserve.Serve(ctx, l, mux); err != nil {
					logger.Error(err, "Serving the probe socket")
				}
			}()
		}
	}
	if addr == "" {
		return
	}
	go func() {
		// During a rolling update on the host network the pod being
		// replaced holds the address until it exits.
		l, _, err := localserve.Listen(ctx, addr, localserve.RetryEvery)
		if err != nil {
			if ctx.Err() == nil {
				logger.Error(err, "Serving metrics and health endpoints", "address", addr)
			}
			return
		}
		if err := localserve.Serve(ctx, l, mux); err != nil {
			logger.Error(err, "Serving metrics and health endpoints", "address", addr)
		}
	}()
}

func setUpProfiling(ctx context.Context, o options, restConfig *rest.Config) (*plugin.ProfilingConfig, error) {
	dirSize, err := resource.ParseQuantity(o.profileDirSize)
	if err != nil || dirSize.Sign() < 0 {
		return nil, fmt.Errorf("--profile-dir-size %q: want a size such as 256Mi, or 0", o.profileDirSize)
	}
	shim := o.shimPath
	if _, err := os.Stat(shim); err != nil {
		built, err := profiling.BuildShim(ctx, filepath.Join(o.stateDir, "shim"))
		if err != nil {
			klog.FromContext(ctx).Error(err, "No profiling shim; claims that ask for profiling will fail to prepare", "path", o.shimPath)
		} else {
			shim = built
		}
	}
	c, err := profiling.NewWorkloadProfileClient(restConfig)
	if err != nil {
		return nil, err
	}
	return &plugin.ProfilingConfig{
		Options:   profiling.Options{StateDir: o.stateDir, NCUDir: o.ncuPath, ShimPath: shim, DirSize: dirSize.Value()},
		Publisher: profiling.NewPublisher(c),
		Retention: o.profileRetention,
		ProcRoot:  "/proc",
	}, nil
}

// mpsInPods says how a plugin in a pod runs its MPS daemons: each in a pod
// of its own, like the plugin's, so that they outlive its container. The
// chart gives the plugin its pod's name and namespace; a plugin without
// them runs on the host and starts its daemons as children.
func mpsInPods(ctx context.Context, client kubernetes.Interface, hostDriverRoot string) (*mps.Pods, string, error) {
	name, namespace := os.Getenv("POD_NAME"), os.Getenv("POD_NAMESPACE")
	if name == "" || namespace == "" {
		return nil, "", nil
	}
	self, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("read the plugin's own pod %s/%s, to run MPS daemons like it: %w", namespace, name, err)
	}
	pods, err := mps.PodsLike(self, client, hostDriverRoot)
	return pods, hostProcRoot(), err
}

// hostProcRoot is where the host's processes are: the chart mounts the
// host's /proc at /host/proc; a plugin running on the host reads its own.
func hostProcRoot() string {
	if _, err := os.Stat("/host/proc/self"); err == nil {
		return "/host/proc"
	}
	return "/proc"
}

// setUpUsage samples the GPUs through the NVML the health watch uses, the
// simulated one in a test build with --fleet. NVML reports host PIDs, so
// the processes' cgroups are read from the host's /proc.
func setUpUsage(o options, restConfig *rest.Config, lib gonvml.Interface) (*sampler.Config, error) {
	if o.usageInterval <= 0 {
		return nil, nil
	}
	c, err := profiling.NewWorkloadProfileClient(restConfig)
	if err != nil {
		return nil, err
	}
	return &sampler.Config{NVML: lib, Profiles: c, ProcRoot: hostProcRoot(), Interval: o.usageInterval}, nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig and not in a cluster: %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}

func parseXIDs(list string) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	for _, f := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == ' ' }) {
		x, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("--ignored-xids: %q is not an Xid number", f)
		}
		out[x] = true
	}
	return out, nil
}

// releaseStartupPages pages out the executable once ready and says what it
// did; a kernel that cannot is not an error.
func releaseStartupPages(ctx context.Context) {
	logger := klog.FromContext(ctx)
	before, err := residency.ReadMemory(0)
	if err != nil {
		logger.V(2).Info("Not releasing start-up pages: cannot read resident memory", "err", err)
		return
	}
	res, err := residency.Release()
	if err != nil {
		logger.Info("Start-up pages of the executable stay resident", "err", err)
		return
	}
	after, _ := residency.ReadMemory(0)
	logger.Info("Released the executable's start-up pages", "mappings", res.Mappings, "residentFileMiBBefore", before.File>>20, "residentFileMiBAfter", after.File>>20)
}

func joinXIDs(xids []uint64) string {
	parts := make([]string, len(xids))
	for i, x := range xids {
		parts[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(parts, ",")
}
