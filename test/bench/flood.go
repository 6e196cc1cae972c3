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
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/internal/controller/webhook"
	"github.com/prismgpu/prism/test/testbed"
)

// FloodOptions bound the admission-flood phase.
type FloodOptions struct {
	AdmissionOptions
	// FloodRate is forged reviews per second, across both replicas.
	FloodRate int
}

// AdmissionFlood runs two prism-controller replicas, each in a memory
// cgroup at the chart's limit, and measures the legitimate admission
// load of the admission phase on both: alone, then twice while a client
// without a certificate sends forged reviews at FloodRate for the same
// time (costly quantities, 1 MiB of them and a small review of ten, and
// 1 MiB claims that decode and rewrite in full). The first flood finds no
// path token, as where nothing authenticates the API server; the second
// finds the default chart's. It fails when a replica exits (the cgroup's
// OOM killer ends it at the limit), or when the legitimate p99 under the
// default chart's flood is more than twice that without.
func AdmissionFlood(ctx context.Context, c *testbed.Cluster, client kubernetes.Interface, o FloodOptions) ([]Row, error) {
	limit, err := chartControllerMemoryLimit(o.RepoRoot)
	if err != nil {
		return nil, err
	}
	if err := createTrainProfile(ctx, c, client); err != nil {
		return nil, err
	}
	if err := ensureFleet(ctx, client); err != nil {
		return nil, err
	}
	var replicas []*webhookUnderLoad
	var cgroups []*memoryCgroup
	defer func() {
		for _, w := range replicas {
			w.stop()
		}
		for _, cg := range cgroups {
			cg.remove()
		}
	}()
	for i := range 2 {
		name := fmt.Sprintf("prism-controller-flood-%d", i)
		cg, err := newMemoryCgroup(name, limit)
		if err != nil {
			return nil, err
		}
		cgroups = append(cgroups, cg)
		ao := o.AdmissionOptions
		ao.CgroupProcs = filepath.Join(cg.dir, "cgroup.procs")
		w, err := startWebhook(ctx, c, ao, name)
		if err != nil {
			return nil, err
		}
		replicas = append(replicas, w)
	}

	quiet, err := loadReplicas(replicas, o.Rate, o.Duration)
	if err != nil {
		return nil, fmt.Errorf("without the flood: %w", err)
	}
	// Without a path token: the controllers answer on the plain paths, as
	// where nothing authenticates the API server (certificates from
	// cert-manager, no client CA), and every forged review is reviewed.
	open, openFlood, err := floodReplicas(replicas, o)
	if err != nil {
		return nil, fmt.Errorf("without a path token: %w", err)
	}
	// Under the default chart: the webhook configurations exist, the
	// controllers keep their path token in them, and the legitimate load
	// names it as the API server does. The forger does not know it.
	cleanup, err := registerWebhookConfigs(ctx, client, replicas)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	if err := waitForPathToken(ctx, client, replicas); err != nil {
		return nil, err
	}
	guarded, guardedFlood, err := floodReplicas(replicas, o)
	if err != nil {
		return nil, fmt.Errorf("with the path token: %w", err)
	}

	var errs []error
	var peaks, hwms []float64
	refusals := map[string]float64{}
	for i, w := range replicas {
		if exited, err := w.proc.Exited(); exited {
			errs = append(errs, fmt.Errorf("replica %d exited under the flood: %v (log %s)", i, err, w.proc.LogPath))
			continue
		}
		peak, err := cgroups[i].peak()
		if err != nil {
			return nil, err
		}
		peaks = append(peaks, mib(peak))
		hwm, err := peakRSS(w.proc.Pid())
		if err != nil {
			return nil, err
		}
		hwms = append(hwms, mib(hwm))
		if err := addRefusals(refusals, w.httpAddr); err != nil {
			return nil, err
		}
	}
	if len(peaks) < len(replicas) {
		return nil, errors.Join(errs...)
	}
	cse := fmt.Sprintf("2 replicas, %s each (the chart's limit), %d forged req/s for %s", resource.NewQuantity(limit, resource.BinarySI), o.FloodRate, o.Duration)
	rows := []Row{
		NewRow("admission-flood", cse, "legitimate p99, no annotation, no path token", "ms", "no flood", ms(Percentile(quiet[0], 0.99)), "flood", ms(Percentile(open[0], 0.99)),
			fmt.Sprintf("%d requests at %d req/s per kind per replica", len(quiet[0]), o.Rate)),
		NewRow("admission-flood", cse, "legitimate p99, rewrite, no path token", "ms", "no flood", ms(Percentile(quiet[1], 0.99)), "flood", ms(Percentile(open[1], 0.99)), ""),
		NewRow("admission-flood", cse, "legitimate p99, no annotation, path token (default)", "ms", "no flood", ms(Percentile(quiet[0], 0.99)), "flood", ms(Percentile(guarded[0], 0.99)), ""),
		NewRow("admission-flood", cse, "legitimate p99, rewrite, path token (default)", "ms", "no flood", ms(Percentile(quiet[1], 0.99)), "flood", ms(Percentile(guarded[1], 0.99)), ""),
		NewRow("admission-flood", cse, "peak memory (cgroup)", "MiB", "limit", mib(uint64(limit)), "highest replica", slices.Max(peaks), fmt.Sprintf("replicas %.1f and %.1f MiB", peaks[0], peaks[1])),
		NewRow("admission-flood", cse, "peak RSS (VmHWM)", "MiB", "limit", mib(uint64(limit)), "highest replica", slices.Max(hwms), fmt.Sprintf("replicas %.1f and %.1f MiB", hwms[0], hwms[1])),
		NewRow("admission-flood", cse, "forged reviews answered", "count", "sent", float64(openFlood.sent+guardedFlood.sent), "answered", float64(openFlood.answered()+guardedFlood.answered()),
			"no token: "+openFlood.summary()+"; token: "+guardedFlood.summary()+"; refused by the controllers: "+fmt.Sprint(refusals)),
	}
	// The goal holds for the default chart. Without a token every forged
	// review is reviewed and competes for the same cores: its rows say
	// what that costs, and docs/security.md says how to close the port.
	for kind, name := range []string{"no annotation", "rewrite"} {
		if q, l := Percentile(quiet[kind], 0.99), Percentile(guarded[kind], 0.99); l > 2*q {
			errs = append(errs, fmt.Errorf("legitimate p99 (%s) under the default chart: %s under the flood, more than twice %s without", name, l, q))
		}
	}
	return rows, errors.Join(errs...)
}

// floodReplicas runs the legitimate load on the replicas while a flood of
// forged reviews is sent to their plain paths.
func floodReplicas(replicas []*webhookUnderLoad, o FloodOptions) ([2][]time.Duration, *flood, error) {
	f := newFlood(replicas)
	stop := make(chan struct{})
	flooded := make(chan error, 1)
	go func() { flooded <- f.run(o.FloodRate, stop) }()
	samples, err := loadReplicas(replicas, o.Rate, o.Duration)
	close(stop)
	return samples, f, errors.Join(<-flooded, err)
}

// registerWebhookConfigs creates the webhook configurations the
// controllers keep, with webhooks the API server never calls (their match
// condition is false): only the controllers read and write them. It
// returns a function that deletes them.
func registerWebhookConfigs(ctx context.Context, client kubernetes.Interface, replicas []*webhookUnderLoad) (func(), error) {
	address := replicas[0].url
	never := []admissionregistrationv1.MatchCondition{{Name: "never", Expression: "false"}}
	rules := []admissionregistrationv1.RuleWithOperations{{
		Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
		Rule:       admissionregistrationv1.Rule{APIGroups: []string{"resource.k8s.io"}, APIVersions: []string{"v1"}, Resources: []string{"resourceclaims"}},
	}}
	none := admissionregistrationv1.SideEffectClassNone
	ignore := admissionregistrationv1.Ignore
	cc := admissionregistrationv1.WebhookClientConfig{URL: &address}
	if _, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhook.MutatingConfigName},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{Name: "rewrite.gpu.prism.dev", ClientConfig: cc, Rules: rules, MatchConditions: never,
			SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: webhook.ValidatingConfigName},
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{Name: "validate.gpu.prism.dev", ClientConfig: cc, Rules: rules, MatchConditions: never,
			SideEffects: &none, FailurePolicy: &ignore, AdmissionReviewVersions: []string{"v1"}}},
	}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return func() {
		ctx := context.WithoutCancel(ctx)
		_ = client.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, webhook.MutatingConfigName, metav1.DeleteOptions{})
		_ = client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Delete(ctx, webhook.ValidatingConfigName, metav1.DeleteOptions{})
	}, nil
}

// waitForPathToken waits until the controllers have written their path
// token into the configurations and both refuse the plain paths (after
// the grace that follows the first token), then points the legitimate
// load at the token's paths, as the API server's.
func waitForPathToken(ctx context.Context, client kubernetes.Interface, replicas []*webhookUnderLoad) error {
	var token string
	if err := wait.PollUntilContextTimeout(ctx, time.Second, 3*time.Minute, true, func(ctx context.Context) (bool, error) {
		m, err := client.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, webhook.MutatingConfigName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		_, token = webhook.SplitPathToken(*m.Webhooks[0].ClientConfig.URL)
		if token == "" {
			return false, nil
		}
		for _, w := range replicas {
			plain := strings.TrimSuffix(w.url, "/"+token)
			if _, _, err := w.postTo(plain+"/"+token, w.bodies[0]); err != nil {
				return false, nil
			}
			if _, _, err := w.postTo(plain, w.bodies[0]); err == nil {
				return false, nil
			}
		}
		return true, nil
	}); err != nil {
		return fmt.Errorf("waiting for the controllers to keep a path token and refuse the plain paths: %w", err)
	}
	for _, w := range replicas {
		w.url = strings.TrimSuffix(w.url, "/"+token) + "/" + token
	}
	return nil
}

// loadReplicas runs the admission phase's load on every replica at once
// and returns the latencies of each kind across them.
func loadReplicas(replicas []*webhookUnderLoad, rate int, d time.Duration) ([2][]time.Duration, error) {
	var mu sync.Mutex
	var all [2][]time.Duration
	var errs []error
	var wg sync.WaitGroup
	for _, w := range replicas {
		wg.Go(func() {
			samples, err := w.load(rate, d)
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
			for kind := range all {
				all[kind] = append(all[kind], samples[kind]...)
			}
		})
	}
	wg.Wait()
	return all, errors.Join(errs...)
}

// flood sends forged reviews as a client that has no certificate and
// does not check the server's: anything that reaches the port.
type flood struct {
	targets []string
	bodies  []floodBody
	hc      *http.Client

	mu       sync.Mutex
	sent     int
	statuses map[string]int // "<body> <status or error>"
}

type floodBody struct {
	name, path string
	data       []byte
}

func newFlood(replicas []*webhookUnderLoad) *flood {
	f := &flood{
		hc: &http.Client{
			Timeout:   30 * time.Second,
			Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}, MaxIdleConnsPerHost: 64}, //nolint:gosec // a forger checks nothing
		},
		statuses: map[string]int{},
	}
	// The forger knows the address, not the path token.
	for _, w := range replicas {
		u, _ := url.Parse(w.url)
		f.targets = append(f.targets, u.Scheme+"://"+u.Host)
	}
	tenCostly := make([]string, 10)
	for i := range tenCostly {
		tenCostly[i] = fmt.Sprintf(`"r%d":"1e-9999999"`, i)
	}
	costlyClaim := func(size int) string {
		var b strings.Builder
		b.WriteString(`{"metadata":{"name":"forged","namespace":"ml","annotations":{"prism.dev/profile":"train"}},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{`)
		for i := 0; b.Len() < size; i++ {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"r%d":"1e-9999999"`, i)
		}
		b.WriteString(`}}}}]}}}`)
		return b.String()
	}
	// A claim the rewrite decodes and answers in full, padded to 1 MiB in
	// an annotation: the most a forged review can make it do.
	paddedClaim := `{"metadata":{"name":"forged","namespace":"ml","annotations":{"prism.dev/profile":"train","pad":"` + strings.Repeat("x", 1<<20) +
		`"}},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev"}}]}}}`
	f.bodies = []floodBody{
		{"costly-1MiB", webhook.RewritePath, forgedReview(costlyClaim(1 << 20))},
		{"costly-ten", webhook.RewritePath, forgedReview(`{"metadata":{"name":"forged","namespace":"ml"},"spec":{"devices":{"requests":[{"name":"gpu","exactly":{"deviceClassName":"gpu.prism.dev","capacity":{"requests":{` + strings.Join(tenCostly, ",") + `}}}}]}}}`)},
		{"costly-1MiB-validate", webhook.ValidatePath, forgedReview(costlyClaim(1 << 20))},
		{"padded-1MiB", webhook.RewritePath, forgedReview(paddedClaim)},
	}
	return f
}

func forgedReview(claim string) []byte {
	return []byte(`{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"forged","kind":{"group":"resource.k8s.io","version":"v1","kind":"ResourceClaim"},"resource":{"group":"resource.k8s.io","version":"v1","resource":"resourceclaims"},"operation":"CREATE","namespace":"ml","object":` + claim + `}}`)
}

// run sends rate reviews a second, taking the bodies and the replicas in
// turn, until stop is closed, and waits for their answers.
func (f *flood) run(rate int, stop <-chan struct{}) error {
	if rate <= 0 {
		return fmt.Errorf("flood rate %d", rate)
	}
	ticker := time.NewTicker(time.Second / time.Duration(rate))
	defer ticker.Stop()
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		select {
		case <-stop:
			wg.Wait()
			return nil
		case <-ticker.C:
		}
		b := f.bodies[i%len(f.bodies)]
		target := f.targets[(i/len(f.bodies))%len(f.targets)]
		f.mu.Lock()
		f.sent++
		f.mu.Unlock()
		wg.Go(func() {
			outcome := "error"
			resp, err := f.hc.Post(target+b.path+"?timeout=10s", "application/json", bytes.NewReader(b.data))
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				outcome = strconv.Itoa(resp.StatusCode)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			f.statuses[b.name+" "+outcome]++
		})
	}
}

func (f *flood) answered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for k, v := range f.statuses {
		if !strings.HasSuffix(k, " error") {
			n += v
		}
	}
	return n
}

// summary lists the answers by body and status.
func (f *flood) summary() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var parts []string
	for k, v := range f.statuses {
		parts = append(parts, fmt.Sprintf("%s: %d", k, v))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// peakRSS is the process's VmHWM, the most resident memory it held.
func peakRSS(pid int) (uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}

// addRefusals adds the controller's prism_webhook_requests_refused_total,
// by reason, to into.
func addRefusals(into map[string]float64, addr string) error {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(data)) {
		rest, ok := strings.CutPrefix(line, `prism_webhook_requests_refused_total{reason="`)
		if !ok {
			continue
		}
		reason, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return err
		}
		into[reason] += v
	}
	return nil
}

// chartControllerMemoryLimit reads controller.resources.limits.memory from
// the chart's values, so that the phase runs at what the chart ships.
func chartControllerMemoryLimit(repoRoot string) (int64, error) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deployments", "helm", "prism", "values.yaml"))
	if err != nil {
		return 0, err
	}
	var values struct {
		Controller struct {
			Resources struct {
				Limits struct {
					Memory resource.Quantity `json:"memory"`
				} `json:"limits"`
			} `json:"resources"`
		} `json:"controller"`
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		return 0, fmt.Errorf("chart values: %w", err)
	}
	limit := values.Controller.Resources.Limits.Memory.Value()
	if limit <= 0 {
		return 0, errors.New("chart values: controller.resources.limits.memory is not set")
	}
	return limit, nil
}

// memoryCgroup is a memory cgroup of the test bed's (v1 or v2) that holds
// a process at a limit, as the container runtime holds a container: past
// it the kernel's OOM killer ends the process.
type memoryCgroup struct {
	dir string
	v2  bool
}

func newMemoryCgroup(name string, limit int64) (*memoryCgroup, error) {
	cg := &memoryCgroup{dir: filepath.Join("/sys/fs/cgroup/memory", name)}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		cg = &memoryCgroup{dir: filepath.Join("/sys/fs/cgroup", name), v2: true}
	}
	if err := os.MkdirAll(cg.dir, 0o755); err != nil {
		return nil, fmt.Errorf("memory cgroup (the phase runs as root): %w", err)
	}
	file := "memory.limit_in_bytes"
	if cg.v2 {
		file = "memory.max"
	}
	if err := os.WriteFile(filepath.Join(cg.dir, file), []byte(strconv.FormatInt(limit, 10)), 0o644); err != nil {
		cg.remove()
		return nil, fmt.Errorf("memory cgroup limit: %w", err)
	}
	return cg, nil
}

// peak is the most memory the cgroup held since its process joined.
func (cg *memoryCgroup) peak() (uint64, error) {
	file := "memory.max_usage_in_bytes"
	if cg.v2 {
		file = "memory.peak"
	}
	data, err := os.ReadFile(filepath.Join(cg.dir, file))
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
}

// remove deletes the cgroup once its process has left (exited).
func (cg *memoryCgroup) remove() { _ = os.Remove(cg.dir) }
