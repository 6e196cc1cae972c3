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

package bench

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"

	gpuv1alpha1 "github.com/prismgpu/prism/api/gpu/v1alpha1"
	prismv1alpha1 "github.com/prismgpu/prism/api/prism/v1alpha1"
	"github.com/prismgpu/prism/internal/controller/servingcert"
	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/test/testbed"
)

// AdmissionOptions bound the admission phase.
type AdmissionOptions struct {
	ControllerBin string
	RepoRoot      string
	Rate          int           // requests per second for each of the two kinds
	Duration      time.Duration // how long the rate is held
	// CgroupProcs is the cgroup.procs file of a cgroup the controller
	// starts in, so that all its memory is charged there; empty: none.
	CgroupProcs string
}

// AdmissionResult carries the controller's RSS for the footprint rows.
type AdmissionResult struct {
	Rows               []Row
	IdleRSS, LoadedRSS float64
}

// Admission runs prism-controller on loopback TLS and posts AdmissionReviews
// straight to its mutating webhook at a sustained rate, a claim whose
// profile has measurements (rewritten) and one without annotation
// (passed through), interleaved so that noise hits both.
func Admission(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o AdmissionOptions) (*AdmissionResult, error) {
	if err := createTrainProfile(ctx, c, client); err != nil {
		return nil, err
	}
	if err := ensureFleet(ctx, client); err != nil {
		return nil, err
	}
	w, err := startWebhook(ctx, c, o, "prism-controller")
	if err != nil {
		return nil, err
	}
	defer w.stop()
	res := &AdmissionResult{}
	time.Sleep(2 * time.Second)
	if res.IdleRSS, err = RSSMiB(w.proc.Pid()); err != nil {
		return nil, err
	}
	samples, err := w.load(o.Rate, o.Duration)
	if err != nil {
		return nil, err
	}
	if res.LoadedRSS, err = RSSMiB(w.proc.Pid()); err != nil {
		return nil, err
	}
	cse := fmt.Sprintf("prism-controller over loopback TLS, %d req/s each for %s", o.Rate, o.Duration)
	note := fmt.Sprintf("%d + %d requests, interleaved", len(samples[0]), len(samples[1]))
	res.Rows = []Row{
		NewRow("admission", cse, "mutating webhook p50", "ms", "no-annotation", ms(Percentile(samples[0], 0.5)), "rewrite", ms(Percentile(samples[1], 0.5)), note),
		NewRow("admission", cse, "mutating webhook p99", "ms", "no-annotation", ms(Percentile(samples[0], 0.99)), "rewrite", ms(Percentile(samples[1], 0.99)), ""),
	}
	return res, nil
}

// createTrainProfile creates the profile the fixture claim names:
// MemoryBound with a 30Gi peak, as in internal/controller/webhook/claimrewrite's BenchmarkAdmission. A
// profile made by an earlier phase is kept.
func createTrainProfile(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface) error {
	return createMLProfile(ctx, c, client, "train", "")
}

// createMLProfile creates the WorkloadProfile name in namespace ml, and the
// namespace: MemoryBound with a 30Gi peak, under the policy. A profile of
// that name made before is kept as it is.
func createMLProfile(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, name string, policy prismv1alpha1.Policy) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	scheme := runtime.NewScheme()
	if err := prismv1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	cr, err := crclient.New(c.Config, crclient.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	wp := &prismv1alpha1.WorkloadProfile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ml"}, Spec: prismv1alpha1.WorkloadProfileSpec{Policy: policy}}
	if err := cr.Create(ctx, wp); apierrors.IsAlreadyExists(err) {
		return nil
	} else if err != nil {
		return fmt.Errorf("create WorkloadProfile %s: %w", name, err)
	}
	wp.Status = prismv1alpha1.WorkloadProfileStatus{BoundType: prismv1alpha1.BoundTypeMemoryBound, PeakMemory: ptr.To(resource.MustParse("30Gi"))}
	if err := cr.Status().Update(ctx, wp); err != nil {
		return fmt.Errorf("set the status of WorkloadProfile %s: %w", name, err)
	}
	return nil
}

// ensureFleet publishes a small mixed fleet where no phase before this one
// did: without GPUs the rewrite has no ladder to cut, and the profiled
// claim would pass through unchanged.
func ensureFleet(ctx context.Context, client kubernetes.Interface) error {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
		FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + gpuv1alpha1.DriverName, Limit: 1,
	})
	if err != nil || len(list.Items) > 0 {
		return err
	}
	fleet, err := NewMixedFleet(ctx, "admission-", 8, 8)
	if err != nil {
		return err
	}
	for _, s := range fleet.Slices {
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return err
		}
	}
	return nil
}

// webhookUnderLoad is a prism-controller run on loopback TLS, with a client
// that posts AdmissionReviews straight to its mutating webhook: a claim
// without annotation (bodies[0], passed through) and one whose profile has
// measurements (bodies[1], rewritten).
type webhookUnderLoad struct {
	proc *testbed.Process
	// httpAddr serves the controller's metrics.
	httpAddr string
	hc       *http.Client
	url      string
	bodies   [2][]byte
	// ready is how long the controller took from its start to rewriting
	// the profiled claim: its informers had synced by then.
	ready time.Duration
}

// startWebhook starts prism-controller as name (its log and certificate
// directory are named after it) and returns once it rewrites the profiled
// claim.
func startWebhook(ctx context.Context, c *testbed.Cluster, o AdmissionOptions, name string) (*webhookUnderLoad, error) {
	port, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	httpPort, err := testbed.FreePort()
	if err != nil {
		return nil, err
	}
	certDir := filepath.Join(c.WorkDir(), name+"-certs")
	started := time.Now()
	// No webhook configuration is registered: the API server's own claims
	// (scheduling, prepare) must not pass through it. The controller's
	// caBundle injector retries in the background.
	bin, args := o.ControllerBin, []string{}
	if o.CgroupProcs != "" {
		// The shell joins the cgroup, then becomes the controller.
		bin, args = "/bin/sh", []string{"-c", `echo $$ >"$0" && exec "$@"`, o.CgroupProcs, o.ControllerBin}
	}
	proc, err := testbed.StartProcess(ctx, name, c.WorkDir(), filepath.Join(c.WorkDir(), "logs", name+".log"), bin, append(args,
		"--kubeconfig="+c.KubeconfigPath, "--webhook-host=127.0.0.1", "--webhook-port="+strconv.Itoa(port),
		"--extra-sans=127.0.0.1", "--cert-dir="+certDir, "--namespace=prism-system", "--replica-name="+name,
		"--http-address=127.0.0.1:"+strconv.Itoa(httpPort), "--policy=performance")...)
	if err != nil {
		return nil, err
	}
	w := &webhookUnderLoad{proc: proc, httpAddr: "127.0.0.1:" + strconv.Itoa(httpPort), url: "https://127.0.0.1:" + strconv.Itoa(port) + webhook.RewritePath}
	if err := w.connect(ctx, o.RepoRoot, "http://127.0.0.1:"+strconv.Itoa(httpPort)+"/readyz", certDir); err != nil {
		w.stop()
		return nil, err
	}
	w.ready = time.Since(started)
	return w, nil
}

func (w *webhookUnderLoad) stop() { _ = w.proc.Stop(5 * time.Second) }

// admissionFixtures holds the claims the admission phase sends: those of
// the claim rewrite handler's tests.
var admissionFixtures = filepath.Join("internal", "controller", "webhook", "claimrewrite", "testdata")

// admissionClaims are the fixtures sent, plain first, then profiled.
var admissionClaims = [2]string{"claim-plain.json", "claim-profiled.json"}

func (w *webhookUnderLoad) connect(ctx context.Context, repoRoot, readyz, certDir string) error {
	if err := waitHTTP(ctx, readyz, w.proc); err != nil {
		return err
	}
	caPEM, err := os.ReadFile(filepath.Join(certDir, servingcert.CAFile))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	w.hc = &http.Client{
		Timeout:   10 * time.Second, // the API server's webhook timeout
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}, ForceAttemptHTTP2: true, MaxIdleConnsPerHost: 64},
	}
	fixture := func(name string) ([]byte, error) {
		obj, err := os.ReadFile(filepath.Join(repoRoot, admissionFixtures, name))
		if err != nil {
			return nil, err
		}
		return json.Marshal(admissionv1.AdmissionReview{
			TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
			Request: &admissionv1.AdmissionRequest{
				UID:       "3c1f7a0e",
				Kind:      metav1.GroupVersionKind{Group: "resource.k8s.io", Version: "v1", Kind: "ResourceClaim"},
				Resource:  metav1.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"},
				Operation: admissionv1.Create, Namespace: "ml", Object: runtime.RawExtension{Raw: obj},
			},
		})
	}
	for i, name := range admissionClaims {
		if w.bodies[i], err = fixture(name); err != nil {
			return err
		}
	}
	// Until the controller's informer has the profile, the claim would be
	// auto-profiled instead of rewritten.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		_, data, err := w.post(w.bodies[1])
		if err != nil {
			return err
		}
		var review admissionv1.AdmissionReview
		_ = json.Unmarshal(data, &review)
		if review.Response != nil && bytes.Contains(review.Response.Patch, []byte("firstAvailable")) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller never rewrote the profiled claim: %s", data)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (w *webhookUnderLoad) post(body []byte) (time.Duration, []byte, error) {
	return w.postTo(w.url, body)
}

// postTo posts a review to url, which must answer it with 200.
func (w *webhookUnderLoad) postTo(url string, body []byte) (time.Duration, []byte, error) {
	start := time.Now()
	resp, err := w.hc.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	d := time.Since(start)
	if err != nil {
		return 0, nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return 0, nil, fmt.Errorf("status %d: %s", resp.StatusCode, data)
	}
	return d, data, nil
}

// load warms both paths, then posts both kinds, interleaved, at rate each
// for d, and returns their latencies. A response that patches the plain
// claim, or leaves the profiled one alone, is an error.
func (w *webhookUnderLoad) load(rate int, d time.Duration) ([2][]time.Duration, error) {
	samples := [2][]time.Duration{}
	for range 20 {
		for _, b := range w.bodies {
			if _, _, err := w.post(b); err != nil {
				return samples, err
			}
		}
	}
	patched := func(data []byte) (bool, error) {
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(data, &review); err != nil || review.Response == nil {
			return false, fmt.Errorf("bad AdmissionReview response: %v", err)
		}
		return len(review.Response.Patch) > 0, nil
	}
	n := rate * int(d/time.Second)
	var mu sync.Mutex
	var errs []error
	var wg sync.WaitGroup
	ticker := time.NewTicker(time.Second / time.Duration(2*rate))
	for i := range 2 * n {
		<-ticker.C
		kind := i % 2
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, data, err := w.post(w.bodies[kind])
			if err == nil {
				var p bool
				if p, err = patched(data); err == nil && p != (kind == 1) {
					err = fmt.Errorf("kind %d: patched=%v", kind, p)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			samples[kind] = append(samples[kind], d)
		}()
	}
	ticker.Stop()
	wg.Wait()
	if len(errs) > 0 {
		return samples, fmt.Errorf("%d of %d admission requests failed, first: %w", len(errs), 2*n, errs[0])
	}
	return samples, nil
}

func waitHTTP(ctx context.Context, url string, proc *testbed.Process) error {
	deadline := time.Now().Add(time.Minute)
	hc := &http.Client{Timeout: time.Second}
	for time.Now().Before(deadline) {
		if exited, err := proc.Exited(); exited {
			return fmt.Errorf("%s exited: %v (log %s)", proc.Name, err, proc.LogPath)
		}
		if resp, err := hc.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return fmt.Errorf("%s: %s not ready after 1m (log %s)", proc.Name, url, proc.LogPath)
}
