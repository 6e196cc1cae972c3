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

// Command prism-controller serves Prism's admission webhooks: the
// profile-aware rewrite of ResourceClaims and the validation of GpuConfig
// parameters and WorkloadProfiles.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
	"sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/fleet"
	"github.com/prismgpu/prism/internal/controller/nodelabels"
	"github.com/prismgpu/prism/internal/controller/servingcert"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/internal/controller/webhook/claimrewrite"
	"github.com/prismgpu/prism/internal/controller/webhook/podaffinity"
	"github.com/prismgpu/prism/internal/controller/webhook/profilewrites"
	"github.com/prismgpu/prism/internal/controller/webhook/validate"
	"github.com/prismgpu/prism/internal/envflag"
	"github.com/prismgpu/prism/internal/localserve"
	"github.com/prismgpu/prism/internal/logging"
	"github.com/prismgpu/prism/internal/version"
	"github.com/prismgpu/prism/pkg/rewrite"
)

type options struct {
	webhookPort                    int
	webhookHost, certDir           string
	clientCAFile                   string
	selfSigned, autoProfile        bool
	serviceName, namespace, policy string
	preference, replicaName        string
	memoryFloor                    rewrite.Form
	noLadderSchedulers             []string
	extraSANs                      []string
	httpAddress, kubeconfig        string
	logging                        *logging.Options
	showVersion                    bool
}

// envNames are the variables that do not follow PRISM_<FLAG>: the
// namespace and the pod's name come from the downward API, the kubeconfig
// from the usual name.
var envNames = map[string]string{
	"namespace":    "POD_NAMESPACE",
	"replica-name": "POD_NAME",
	"kubeconfig":   "KUBECONFIG",
	"v":            "PRISM_VERBOSITY",
}

func newFlags(o *options) *pflag.FlagSet {
	flags := pflag.NewFlagSet("prism-controller", pflag.ContinueOnError)
	flags.IntVar(&o.webhookPort, "webhook-port", 9443, "Port of the webhook HTTPS server.")
	flags.StringVar(&o.webhookHost, "webhook-host", "", "Address the webhook server binds to (empty: all).")
	flags.StringVar(&o.certDir, "cert-dir", filepath.Join(os.TempDir(), "prism-webhook-certs"), "Directory of tls.crt and tls.key; written when --self-signed, watched otherwise.")
	flags.StringVar(&o.clientCAFile, "client-ca-file", "", "PEM bundle of the CAs that a webhook client's certificate must chain to, such as the one the API server presents through its admission configuration; read again when it changes (empty: no client certificate is asked for and any client is served).")
	flags.BoolVar(&o.selfSigned, "self-signed", true, "Generate and rotate a private CA and serving certificate and inject the CA into the webhook configurations; false: use certificates (from cert-manager) in --cert-dir.")
	flags.StringVar(&o.serviceName, "service-name", "prism-controller", "Service in front of the webhook, for the certificate's DNS names.")
	flags.StringVar(&o.namespace, "namespace", "", "Namespace of the Service.")
	flags.StringSliceVar(&o.extraSANs, "extra-sans", nil, "Additional DNS names or IPs for the self-signed serving certificate.")
	flags.StringVar(&o.replicaName, "replica-name", "", "This replica's pod name, which its self-signed CA carries so that the caBundle drops the CAs of replicas no longer behind the Service (empty: the hostname, which is the pod's name except on the host network).")
	flags.StringVar(&o.policy, "policy", "performance", "Cluster-wide allocation policy, performance, economy or load-aware; a WorkloadProfile's spec.policy overrides it.")
	flags.StringVar(&o.preference, "preference", "ladder", "How a profile's preference for GPU models reaches the scheduler: ladder (firstAvailable tiers in the claim) or affinity (hard needs in the claim, preferred node affinity on the pod, on single-model nodes that the controller labels; needs the chart's nodes permission).")
	o.memoryFloor = rewrite.FormCapacity
	flags.Var(&o.memoryFloor, "memory-floor", "How a profile's memory floor and its tiers' lower bounds are written: capacity (capacity requests, used once a dry-run claim shows that the API server keeps them) or cel (selectors, for a cluster whose kube-scheduler has DRAConsumableCapacity off while the API server keeps capacity requests, which the controller cannot see).")
	flags.StringSliceVar(&o.noLadderSchedulers, "no-ladder-schedulers", []string{"kai-scheduler"}, "Schedulers that count a claim's GPUs only from exactly requests, as KAI-Scheduler does: the claims of their pods keep exactly requests, with the hard needs, instead of a firstAvailable ladder (empty: none).")
	flags.BoolVar(&o.autoProfile, "auto-profile", true, "Enable profiling for claims whose WorkloadProfile has no measurements yet.")
	flags.StringVar(&o.httpAddress, "http-address", ":8080", "Address of the /metrics, /healthz and /readyz endpoints.")
	flags.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig file (empty: in-cluster configuration).")
	o.logging = logging.NewOptions()
	o.logging.AddFlags(flags)
	flags.BoolVar(&o.showVersion, "version", false, "Print the build information and exit.")
	envflag.Bind(flags, "PRISM_", envNames, "version")
	return flags
}

func main() {
	var o options
	flags := newFlags(&o)
	envflag.ParseCommandLine(flags)
	if o.showVersion {
		fmt.Println("prism-controller", version.Get())
		return
	}
	envflag.ExitIfInvalid(flags, errors.Join(o.validate(), o.logging.Apply()))
	logging.Run("prism-controller", func(ctx context.Context) error { return run(ctx, o) })
}

func (o *options) validate() error {
	var errs []error
	if o.webhookPort < 1 || o.webhookPort > 65535 {
		errs = append(errs, fmt.Errorf("--webhook-port %d: must be between 1 and 65535", o.webhookPort))
	}
	if _, err := prismv1alpha1.ParsePolicy(o.policy); err != nil {
		errs = append(errs, fmt.Errorf("--policy: %w", err))
	}
	if _, err := rewrite.ParsePreference(o.preference); err != nil {
		errs = append(errs, fmt.Errorf("--preference: %w", err))
	}
	if o.selfSigned && o.namespace == "" {
		errs = append(errs, errors.New("--namespace (or $POD_NAMESPACE) is required with --self-signed"))
	}
	if o.certDir == "" {
		errs = append(errs, errors.New("--cert-dir must not be empty"))
	}
	if _, _, err := net.SplitHostPort(o.httpAddress); err != nil {
		errs = append(errs, fmt.Errorf("--http-address %q: %w", o.httpAddress, err))
	}
	return errors.Join(errs...)
}

func run(ctx context.Context, o options) error {
	logger := klog.FromContext(ctx)
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("loading client configuration: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("creating clientset: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}

	// WorkloadProfiles are read from an informer: a webhook that called
	// the API server for every claim would add a round trip to each.
	// ResourceClaims, of which the store keeps only the fleet.Claim that
	// the readers read, tell which node may write which profile, and the
	// fleet's load; while they wait, their plans give the pods that name
	// them their node preference.
	// Pods that wait to be scheduled, trimmed to the claims made for them
	// and their scheduler's name, tell which of those claims their pods
	// use, and which claims get no ladder. ResourceSlices of Prism's
	// driver are the fleet the ladders are cut from; the store keeps of
	// each only the fleet.Slice the view reads. controller-runtime's
	// informers read built-in types as protobuf, which decodes several
	// times faster than JSON; WorkloadProfiles, a CRD, come as JSON.
	preference, _ := rewrite.ParsePreference(o.preference)
	byObject := map[client.Object]cache.ByObject{
		&prismv1alpha1.WorkloadProfile{}: {},
		&resourceapi.ResourceSlice{}:     {Field: fields.OneTermEqualSelector("spec.driver", gpuv1alpha1.DriverName), Transform: fleet.TrimSlice},
	}
	// The claims and the pods are a cache of their own, started once the
	// profiles and slices have synced: listed together with them, their
	// initial lists share the CPUs and the API server with the slices'
	// and delay the first review that needs only those (at 5,000 nodes
	// and 50,000 claims on 2 cores, 1.28 s to the first rewrite against
	// 0.88 s with no claims).
	waiting, err := cache.New(cfg, cache.Options{Scheme: scheme, ReaderFailOnMissingInformer: true, ByObject: map[client.Object]cache.ByObject{
		&resourceapi.ResourceClaim{}: {Transform: fleet.TrimClaim},
		&corev1.Pod{}:                {Field: fleet.UnscheduledPods(), Transform: claimrewrite.KeepSchedulerName(fleet.TrimPod)},
	}})
	if err != nil {
		return fmt.Errorf("creating the ResourceClaim and Pod cache: %w", err)
	}
	if preference == rewrite.PreferAffinity {
		// The pod webhook finds a pod's profile through its claim
		// templates; the labeller reads nodes' labels, and nothing else.
		byObject[&resourceapi.ResourceClaimTemplate{}] = cache.ByObject{}
		byObject[&corev1.Node{}] = cache.ByObject{Transform: nodelabels.TrimNode}
	}
	profiles, err := cache.New(cfg, cache.Options{Scheme: scheme, ReaderFailOnMissingInformer: true, ByObject: byObject})
	if err != nil {
		return fmt.Errorf("creating WorkloadProfile cache: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics, err := webhook.NewMetrics(reg)
	if err != nil {
		return err
	}
	// The controller serves once the informers that every review reads
	// have synced: the WorkloadProfiles and the slices, which the fleet is
	// cut from (and, for the pod webhook, the claim templates). The claims
	// and the unscheduled pods, whose initial lists take most of the start
	// in a large cluster, sync after; a review that reads them waits for
	// them (see webhook.Synced). The stores sync before the handlers have
	// seen all they hold, so each part waits for its handlers too: a
	// partial fleet could cut a ladder that the whole fleet would not.
	fleetSynced, claimsSynced, podsSynced := webhook.NewSynced("profiles and slices", nil), webhook.NewSynced("claims", metrics), webhook.NewSynced("pods", metrics)
	syncs := map[*webhook.Synced][]toolscache.InformerSynced{}
	handle := func(part *webhook.Synced, i cache.Informer, h toolscache.ResourceEventHandler, what string) error {
		r, err := i.AddEventHandler(h)
		if err != nil {
			return fmt.Errorf("watching %s: %w", what, err)
		}
		syncs[part] = append(syncs[part], i.HasSynced, r.HasSynced)
		return nil
	}
	profileInformer, err := profiles.GetInformer(ctx, &prismv1alpha1.WorkloadProfile{})
	if err != nil {
		return fmt.Errorf("starting WorkloadProfile informer: %w", err)
	}
	profileClaims := profilewrites.NewProfileClaims()
	claimInformer, err := waiting.GetInformer(ctx, &resourceapi.ResourceClaim{})
	if err != nil {
		return fmt.Errorf("starting ResourceClaim informer: %w", err)
	}
	if err := handle(claimsSynced, claimInformer, profileClaims, "ResourceClaims"); err != nil {
		return err
	}
	fleetView := fleet.NewView()
	if err := handle(claimsSynced, claimInformer, fleetView, "ResourceClaims for the fleet's load"); err != nil {
		return err
	}
	// A waiting claim counts with its profile's bound type, not the one its
	// annotation states.
	if err := handle(fleetSynced, profileInformer, fleetView, "WorkloadProfiles for the fleet's load"); err != nil {
		return err
	}
	// A waiting claim counts only when its pod's status names it: anyone
	// who creates a claim can point its ownerReference at a pod.
	podInformer, err := waiting.GetInformer(ctx, &corev1.Pod{})
	if err != nil {
		return fmt.Errorf("starting Pod informer: %w", err)
	}
	if err := handle(podsSynced, podInformer, fleetView, "Pods for the fleet's load"); err != nil {
		return err
	}
	sliceInformer, err := profiles.GetInformer(ctx, &resourceapi.ResourceSlice{})
	if err != nil {
		return fmt.Errorf("starting ResourceSlice informer: %w", err)
	}
	if err := handle(fleetSynced, sliceInformer, fleetView, "ResourceSlices"); err != nil {
		return err
	}
	if preference == rewrite.PreferAffinity {
		if err := startLabeller(ctx, cs, profiles, fleetView); err != nil {
			return err
		}
		templateInformer, err := profiles.GetInformer(ctx, &resourceapi.ResourceClaimTemplate{})
		if err != nil {
			return fmt.Errorf("starting ResourceClaimTemplate informer: %w", err)
		}
		syncs[fleetSynced] = append(syncs[fleetSynced], templateInformer.HasSynced)
	}
	go func() {
		if err := profiles.Start(ctx); err != nil {
			logger.Error(err, "WorkloadProfile cache stopped")
		}
	}()
	fleetSyncs := slices.Clone(syncs[fleetSynced])
	go func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), fleetSyncs...) {
			return
		}
		if err := waiting.Start(ctx); err != nil {
			logger.Error(err, "ResourceClaim and Pod cache stopped")
		}
	}()
	started := time.Now()
	// The store holds fleet.Claims, which controller-runtime's reader
	// cannot return: the pod webhook reads the informer's store itself.
	claimStore, ok := claimInformer.(toolscache.SharedIndexInformer)
	if !ok {
		return fmt.Errorf("the ResourceClaim informer is a %T, which keeps no store to read", claimInformer)
	}
	podStore, ok := podInformer.(toolscache.SharedIndexInformer)
	if !ok {
		return fmt.Errorf("the Pod informer is a %T, which keeps no store to read", podInformer)
	}
	go markSynced(ctx, claimsSynced, syncs[claimsSynced], claimStore.GetStore(), started)
	go markSynced(ctx, podsSynced, syncs[podsSynced], podStore.GetStore(), started)

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme, corev1.EventSource{Component: "prism-controller"})

	rewriteMetrics, err := claimrewrite.NewMetrics(reg)
	if err != nil {
		return err
	}
	podMetrics, err := podaffinity.NewMetrics(reg)
	if err != nil {
		return err
	}
	policy, _ := prismv1alpha1.ParsePolicy(o.policy)
	rewriter, err := claimrewrite.New(claimrewrite.Options{Profiles: profiles, Policy: policy, AutoProfile: o.autoProfile, Recorder: recorder, Metrics: rewriteMetrics,
		Fleet: fleetView.Fleet, Load: fleetView.Load, LoadSynced: []*webhook.Synced{claimsSynced, podsSynced}, Preference: preference, Capacity: capacityDecision(ctx, o, cs),
		NoLadderSchedulers: o.noLadderSchedulers, PodScheduler: claimrewrite.PodSchedulers{Cache: waiting, CacheSynced: podsSynced, API: cs.CoreV1()}.SchedulerOf})
	if err != nil {
		return err
	}
	podPreference, err := podaffinity.New(podaffinity.Options{Templates: profiles, Claims: claimStore.GetStore(), ClaimsSynced: claimsSynced, Profiles: profiles, Policy: policy,
		Preference: preference, Fleet: fleetView.Fleet, Metrics: podMetrics})
	if err != nil {
		return err
	}
	validator, err := validate.New(metrics)
	if err != nil {
		return err
	}
	profileWrites, err := profilewrites.New(profileClaims, claimsSynced, metrics)
	if err != nil {
		return err
	}

	var getCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// Self-signed, the controller keeps the webhook configurations, and
	// with them a path token (webhook.PathToken). It is ready once it has
	// read them: before, it would refuse the API server's reviews.
	var token *webhook.PathToken
	configsRead := webhook.NewSynced("webhook configurations", nil)
	if o.selfSigned {
		// The pod's name is what the Service's EndpointSlices list: CAs of
		// replicas that are gone can then be told apart. On the host network
		// the hostname is the node's, hence the downward API's name first.
		replica := o.replicaName
		if replica == "" {
			if replica, err = os.Hostname(); err != nil {
				return fmt.Errorf("reading the hostname, this replica's name: %w", err)
			}
		}
		certs, err := servingcert.NewSelfSigned(ctx, servingcert.Options{Dir: o.certDir, ServiceName: o.serviceName, Namespace: o.namespace, ExtraSANs: o.extraSANs, Replica: replica})
		if err != nil {
			return fmt.Errorf("creating self-signed certificates: %w", err)
		}
		token = webhook.NewPathToken()
		injector := &servingcert.CABundleInjector{Client: cs, MutatingName: webhook.MutatingConfigName, ValidatingName: webhook.ValidatingConfigName, Bundle: certs.CABundle,
			Replica: replica, Replicas: servingcert.ServiceReplicas(cs, o.namespace, o.serviceName), PathToken: token}
		go func() {
			// Run logs a failure; a first try, failed or not, is enough
			// to serve: where the configurations cannot be read, plain
			// paths are served until they can.
			_ = injector.Sync(ctx)
			configsRead.MarkSynced()
			injector.Run(ctx)
		}()
		go certs.Run(ctx, injector.Sync)
		getCertificate = certs.GetCertificate
	} else {
		w, err := certwatcher.New(filepath.Join(o.certDir, servingcert.CertFile), filepath.Join(o.certDir, servingcert.KeyFile))
		if err != nil {
			return fmt.Errorf("loading certificates from %s: %w", o.certDir, err)
		}
		go func() {
			if err := w.Start(ctx); err != nil {
				logger.Error(err, "Certificate watcher stopped")
			}
		}()
		getCertificate = w.GetCertificate
		configsRead.MarkSynced()
	}

	go func() {
		if !toolscache.WaitForCacheSync(ctx.Done(), syncs[fleetSynced]...) {
			return
		}
		fleetSynced.MarkSynced()
		select {
		case <-configsRead.Done():
		case <-ctx.Done():
			return
		}
		var syncing []string
		for _, s := range []*webhook.Synced{claimsSynced, podsSynced} {
			if !s.HasSynced() {
				syncing = append(syncing, s.Name())
			}
		}
		logger.Info("Serving the webhooks: the fleet view is built", "models", len(fleetView.Fleet().Models), "nodes", len(fleetView.NodeModels()),
			"after", time.Since(started).Round(time.Millisecond), "stillSyncing", syncing)
	}()
	go serveHTTP(ctx, o.httpAddress, reg, readiness{needed: []*webhook.Synced{fleetSynced, configsRead}, later: []*webhook.Synced{claimsSynced, podsSynced}})

	var clientCAs *webhook.ClientCAs
	if o.clientCAFile != "" {
		if clientCAs, err = webhook.LoadClientCAs(ctx, o.clientCAFile); err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(o.webhookHost, strconv.Itoa(o.webhookPort)))
	if err != nil {
		return fmt.Errorf("listening for webhooks: %w", err)
	}
	return webhook.Serve(ctx, l, webhook.ServerTLS(getCertificate, clientCAs), webhook.NewMux(metrics, token, rewriter, validator, profileWrites, podPreference))
}

// startLabeller labels single-model GPU nodes from the fleet view, on
// every change of the fleet, when a node joins, and when someone changes a
// label the labeller owns.
func startLabeller(ctx context.Context, cs kubernetes.Interface, c cache.Cache, view *fleet.View) error {
	trigger := make(chan struct{}, 1)
	poke := func() {
		select {
		case trigger <- struct{}{}:
		default:
		}
	}
	nodes, err := c.GetInformer(ctx, &corev1.Node{})
	if err != nil {
		return fmt.Errorf("starting Node informer: %w", err)
	}
	if _, err := nodes.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { poke() },
		UpdateFunc: func(oldObj, newObj any) {
			o, ok1 := oldObj.(*corev1.Node)
			n, ok2 := newObj.(*corev1.Node)
			if ok1 && ok2 && nodelabels.Changed(o, n) {
				poke()
			}
		},
	}); err != nil {
		return fmt.Errorf("watching Nodes: %w", err)
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-view.Changed():
				poke()
			}
		}
	}()
	l := &nodelabels.Labeller{Client: cs, Source: nodelabels.Source{
		NodeModels: view.NodeModels,
		Fleet:      view.Fleet,
		Nodes: func(ctx context.Context) ([]corev1.Node, error) {
			var list corev1.NodeList
			err := c.List(ctx, &list)
			return list.Items, err
		},
	}}
	go func() {
		if c.WaitForCacheSync(ctx) {
			l.Run(ctx, trigger)
		}
	}()
	return nil
}

// markSynced marks part synced once every informer and handler it is read
// from has synced, and logs how many objects store holds then and how long
// after started that was.
func markSynced(ctx context.Context, part *webhook.Synced, synced []toolscache.InformerSynced, store toolscache.Store, started time.Time) {
	if !toolscache.WaitForCacheSync(ctx.Done(), synced...) {
		return
	}
	part.MarkSynced()
	klog.FromContext(ctx).Info("Informer synced: reviews that read it no longer wait", "informer", part.Name(), "objects", len(store.ListKeys()),
		"after", time.Since(started).Round(time.Millisecond))
}

// readiness is what /readyz reports: ready once the needed parts have
// synced; the later ones, which only some reviews read and which wait for
// them, are listed with ?verbose.
type readiness struct {
	needed, later []*webhook.Synced
}

func (r readiness) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	ready := true
	var b strings.Builder
	for _, s := range r.needed {
		ready = ready && s.HasSynced()
		fmt.Fprintf(&b, "%s: %s\n", s.Name(), syncState(s))
	}
	for _, s := range r.later {
		fmt.Fprintf(&b, "%s: %s (not needed to serve: reviews that read it wait for it)\n", s.Name(), syncState(s))
	}
	_, verbose := req.URL.Query()["verbose"]
	switch {
	case !ready:
		w.WriteHeader(http.StatusServiceUnavailable)
		b.WriteString("not ready\n")
	case verbose:
		b.WriteString("ok\n")
	default:
		b.Reset()
		b.WriteString("ok")
	}
	_, _ = w.Write([]byte(b.String()))
}

func syncState(s *webhook.Synced) string {
	if s.HasSynced() {
		return "synced"
	}
	return "syncing"
}

// serveHTTP serves metrics and probes.
func serveHTTP(ctx context.Context, addr string, reg *prometheus.Registry, ready readiness) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	mux.Handle("/readyz", ready)
	l, err := net.Listen("tcp", addr)
	if err == nil {
		err = localserve.Serve(ctx, l, mux)
	}
	if err != nil {
		klog.FromContext(ctx).Error(err, "Serving metrics and probes")
	}
}

// capacityDecision starts the probe the capacity requests rest on, and
// returns the decision it makes with --memory-floor once the API server
// answers (rewrite.Capacity): whether the rewriter offers GPU shares, and
// whether it writes the memory floor and the tier bounds as capacity
// requests. pkg/rewrite still declines either for a claim where the fleet
// does not allow it. Where the API server would drop a claim's capacity
// requests, or that cannot be checked, shares are not offered and the
// floors stay CEL, the log says why once and every plan says why: a
// degraded form costs the scheduler time, never a placement.
func capacityDecision(ctx context.Context, o options, cs kubernetes.Interface) func() rewrite.Capacity {
	if o.namespace == "" {
		klog.FromContext(ctx).Info("No GPU shares, and memory floors and tier bounds stay CEL: without --namespace there is nowhere to probe the API server with a dry-run claim")
		return claimrewrite.Unprobed
	}
	// Probed once the webhooks are served: the dry-run claim passes through
	// this controller's own admission webhooks.
	probe := &claimrewrite.MemoryFloorProbe{Client: cs, Namespace: o.namespace, Form: o.memoryFloor}
	go probe.Run(ctx)
	return probe.Capacity
}
