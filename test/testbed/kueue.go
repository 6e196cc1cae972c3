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
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/internal/controller/servingcert"
)

// KueueCRDDir is the directory next to the test-bed binaries that
// hack/testbed-bins.sh fills with Kueue's CRDs.
const KueueCRDDir = "kueue-crds"

// KueueQueueNameLabel is the label that puts a Job in a Kueue LocalQueue.
const KueueQueueNameLabel = "kueue.x-k8s.io/queue-name"

// KueuePriorityClassLabel names the WorkloadPriorityClass of a Job.
const KueuePriorityClassLabel = "kueue.x-k8s.io/priority-class"

// KueueWorkloads is the resource of Kueue's Workloads. It is spelled out in
// full: Kubernetes may serve a Workload kind of its own.
var KueueWorkloads = schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "workloads"}

// KueueOptions configure StartKueue.
type KueueOptions struct {
	// DeviceClassMappings maps a resource name that ClusterQueues give
	// quota for (such as prism.dev/gpu) to the DeviceClasses whose devices,
	// requested in ResourceClaimTemplates, count against it.
	DeviceClassMappings map[string][]string
	// FairSharing turns on Kueue's fair sharing between the ClusterQueues
	// of a cohort, with Kueue's default preemption strategies.
	FairSharing bool
}

// Kueue is Kueue's controller manager running against the cluster as a
// host process, with the batch/job integration and DRA counting on.
type Kueue struct {
	Process *Process
	// WebhookAddr is where the API server reaches Kueue's webhooks.
	WebhookAddr string
}

// StartKueue installs Kueue's CRDs, starts Kueue's controller manager on
// loopback and registers its webhooks for Jobs and its own objects by URL,
// with a CA of the test bed's own making. It returns once Kueue answers its
// webhooks. Kueue stops with the cluster; its log is kueue.log among the
// component logs.
func (c *Cluster) StartKueue(ctx context.Context, opts KueueOptions) (*Kueue, error) {
	logger := klog.FromContext(ctx)
	start := time.Now()
	bin := c.BinPath("kueue")
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("kueue missing in %s: run hack/testbed-bins.sh", c.opts.BinDir)
	}
	if _, err := envtest.InstallCRDs(c.Config, envtest.CRDInstallOptions{
		Paths: []string{c.BinPath(KueueCRDDir)}, ErrorIfPathMissing: true,
	}); err != nil {
		return nil, fmt.Errorf("install Kueue's CRDs from %s: %w", c.BinPath(KueueCRDDir), err)
	}

	dir := filepath.Join(c.opts.WorkDir, "kueue")
	certDir := filepath.Join(dir, "certs")
	// The same self-signed CA and serving certificate as prism-controller
	// makes for itself; the IP SAN is what a URL webhook on loopback needs.
	certs, err := servingcert.NewSelfSigned(ctx, servingcert.Options{
		Dir: certDir, ServiceName: "kueue-webhook-service", Namespace: "kueue-system", ExtraSANs: []string{"127.0.0.1"},
	})
	if err != nil {
		return nil, fmt.Errorf("make Kueue's webhook certificate: %w", err)
	}
	webhookPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	healthPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	config, err := kueueConfig(opts, certDir, webhookPort, healthPort)
	if err != nil {
		return nil, err
	}
	configPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(configPath, config, 0o644); err != nil {
		return nil, err
	}

	// With internal certificate management off, Kueue reads a metrics
	// certificate from the fixed path /etc/kueue/metrics/certs and exits
	// without it, metrics server or not. It gets that path in a mount
	// namespace of its own, over an overlay of /etc, so the host's /etc is
	// not touched (the kubelets' private directories work the same way).
	overlay := filepath.Join(dir, "etc-overlay")
	if err := os.MkdirAll(overlay, 0o700); err != nil {
		return nil, err
	}
	script := `set -e
o=$1; c=$2; shift 2
mount -t tmpfs tmpfs "$o"; mkdir "$o/upper" "$o/work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$o/upper,workdir=$o/work" /etc
mkdir -p /etc/kueue/metrics/certs
cp "$c/tls.crt" "$c/tls.key" /etc/kueue/metrics/certs/
exec "$@"
`
	proc, err := StartProcess(ctx, "kueue", dir, filepath.Join(c.opts.WorkDir, "logs", "kueue.log"),
		"unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "kueue", overlay, certDir,
		bin, "--config="+configPath, "--kubeconfig="+c.KubeconfigPath, "--zap-log-level=2")
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, proc)
	k := &Kueue{Process: proc, WebhookAddr: "127.0.0.1:" + strconv.Itoa(webhookPort)}

	readyz := "http://127.0.0.1:" + strconv.Itoa(healthPort) + "/readyz"
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := proc.Exited(); exited {
			return false, fmt.Errorf("kueue exited (%v), see %s", err, proc.LogPath)
		}
		resp, err := http.Get(readyz)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return nil, fmt.Errorf("wait for Kueue's /readyz: %w", err)
	}
	if err := k.registerWebhooks(ctx, c, certs.CABundle()); err != nil {
		return nil, err
	}
	if err := k.waitForWebhooks(ctx, c); err != nil {
		return nil, err
	}
	logger.Info("Kueue ready", "elapsed", time.Since(start).Round(time.Millisecond), "webhook", k.WebhookAddr, "log", proc.LogPath)
	return k, nil
}

// kueueConfig is Kueue's Configuration for a host process on loopback:
// no certificate management, leader election, metrics or visibility
// server; only the batch/job integration; DRA counting with the mappings.
func kueueConfig(opts KueueOptions, certDir string, webhookPort, healthPort int) ([]byte, error) {
	var mappings []map[string]any
	for name, classes := range opts.DeviceClassMappings {
		mappings = append(mappings, map[string]any{"name": name, "deviceClassNames": classes})
	}
	cfg := map[string]any{
		"apiVersion": "config.kueue.x-k8s.io/v1beta2",
		"kind":       "Configuration",
		"namespace":  "kueue-system",
		// Only Jobs with a queue-name label are Kueue's.
		"manageJobsWithoutQueueName": false,
		"leaderElection":             map[string]any{"leaderElect": false},
		// Its certificates name only <service>.<namespace>.svc.
		"internalCertManagement": map[string]any{"enable": false},
		"webhook":                map[string]any{"host": "127.0.0.1", "port": webhookPort, "certDir": certDir},
		"metrics":                map[string]any{"bindAddress": "0"},
		"health":                 map[string]any{"healthProbeBindAddress": "127.0.0.1:" + strconv.Itoa(healthPort)},
		"featureGates": map[string]any{
			"DynamicResourceAllocation": true,
			// On by default; it would serve an aggregated API on 0.0.0.0.
			"VisibilityOnDemand": false,
		},
		"integrations": map[string]any{"frameworks": []string{"batch/job"}},
	}
	if len(mappings) > 0 {
		cfg["resources"] = map[string]any{"deviceClassMappings": mappings}
	}
	if opts.FairSharing {
		cfg["fairSharing"] = map[string]any{"preemptionStrategies": []string{"LessThanOrEqualToFinalShare", "LessThanInitialShare"}}
	}
	return yaml.Marshal(cfg)
}

// kueueWebhook is one of Kueue's webhooks: its name, path and what it
// admits.
type kueueWebhook struct {
	name, path string
	group      string
	resources  []string
	ops        []admissionv1.OperationType
}

var (
	kueueCreate       = []admissionv1.OperationType{admissionv1.Create}
	kueueCreateUpdate = []admissionv1.OperationType{admissionv1.Create, admissionv1.Update}
	// From Kueue's config/components/webhook/manifests.yaml: the batch/job
	// integration's and those of Kueue's own objects. Pods are left out, so
	// that no pod admission depends on Kueue.
	kueueMutating = []kueueWebhook{
		{"mjob.kb.io", "/mutate-batch-v1-job", "batch", []string{"jobs"}, kueueCreate},
		{"mclusterqueue.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-clusterqueue", "kueue.x-k8s.io", []string{"clusterqueues"}, kueueCreate},
		{"mresourceflavor.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-resourceflavor", "kueue.x-k8s.io", []string{"resourceflavors"}, kueueCreate},
		{"mworkload.kb.io", "/mutate-kueue-x-k8s-io-v1beta2-workload", "kueue.x-k8s.io", []string{"workloads"}, kueueCreate},
	}
	kueueValidating = []kueueWebhook{
		{"vjob.kb.io", "/validate-batch-v1-job", "batch", []string{"jobs"}, kueueCreateUpdate},
		{"vclusterqueue.kb.io", "/validate-kueue-x-k8s-io-v1beta2-clusterqueue", "kueue.x-k8s.io", []string{"clusterqueues"}, kueueCreateUpdate},
		{"vcohort.kb.io", "/validate-kueue-x-k8s-io-v1beta2-cohort", "kueue.x-k8s.io", []string{"cohorts"}, kueueCreateUpdate},
		{"vresourceflavor.kb.io", "/validate-kueue-x-k8s-io-v1beta2-resourceflavor", "kueue.x-k8s.io", []string{"resourceflavors"}, kueueCreateUpdate},
		{"vworkload.kb.io", "/validate-kueue-x-k8s-io-v1beta2-workload", "kueue.x-k8s.io", []string{"workloads", "workloads/status"}, kueueCreateUpdate},
	}
)

// webhook is w as a validating webhook; a mutating one has the same fields.
func (w kueueWebhook) webhook(base string, caBundle []byte) admissionv1.ValidatingWebhook {
	version := "v1beta2"
	var selector *metav1.LabelSelector
	if w.group == "batch" {
		version = "v1"
		// Jobs without a queue never reach Kueue, so that other tests'
		// Jobs do not depend on it.
		selector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: KueueQueueNameLabel, Operator: metav1.LabelSelectorOpExists}}}
	}
	return admissionv1.ValidatingWebhook{
		Name:           w.name,
		ClientConfig:   admissionv1.WebhookClientConfig{URL: ptr.To(base + w.path), CABundle: caBundle},
		Rules:          []admissionv1.RuleWithOperations{{Operations: w.ops, Rule: admissionv1.Rule{APIGroups: []string{w.group}, APIVersions: []string{version}, Resources: w.resources}}},
		ObjectSelector: selector,
		SideEffects:    ptr.To(admissionv1.SideEffectClassNone), FailurePolicy: ptr.To(admissionv1.Fail), AdmissionReviewVersions: []string{"v1"},
	}
}

func (k *Kueue) registerWebhooks(ctx context.Context, c *Cluster, caBundle []byte) error {
	base := "https://" + k.WebhookAddr
	mutating := &admissionv1.MutatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-mutating-webhook-configuration"}}
	for _, w := range kueueMutating {
		v := w.webhook(base, caBundle)
		mutating.Webhooks = append(mutating.Webhooks, admissionv1.MutatingWebhook{
			Name: v.Name, ClientConfig: v.ClientConfig, Rules: v.Rules, ObjectSelector: v.ObjectSelector,
			SideEffects: v.SideEffects, FailurePolicy: v.FailurePolicy, AdmissionReviewVersions: v.AdmissionReviewVersions,
		})
	}
	validating := &admissionv1.ValidatingWebhookConfiguration{ObjectMeta: metav1.ObjectMeta{Name: "kueue-validating-webhook-configuration"}}
	for _, w := range kueueValidating {
		validating.Webhooks = append(validating.Webhooks, w.webhook(base, caBundle))
	}
	if _, err := c.Client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, mutating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("register Kueue's mutating webhooks: %w", err)
	}
	if _, err := c.Client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, validating, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("register Kueue's validating webhooks: %w", err)
	}
	return nil
}

// waitForWebhooks waits until a dry-run ResourceFlavor passes Kueue's
// webhooks, which the API server calls only once it has the configurations.
func (k *Kueue) waitForWebhooks(ctx context.Context, c *Cluster) error {
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
		"metadata": map[string]any{"name": "prism-testbed-probe"},
	}}
	flavors := schema.GroupVersionResource{Group: "kueue.x-k8s.io", Version: "v1beta2", Resource: "resourceflavors"}
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		if exited, err := k.Process.Exited(); exited {
			return false, fmt.Errorf("kueue exited (%v), see %s", err, k.Process.LogPath)
		}
		_, last = dyn.Resource(flavors).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("wait for Kueue's webhooks (last: %v): %w", last, err)
	}
	return nil
}
