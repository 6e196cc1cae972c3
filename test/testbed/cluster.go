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

// Package testbed runs a real Kubernetes cluster on one machine for tests and
// for the demo: etcd, kube-apiserver, kube-scheduler, kube-controller-manager
// and real kubelets whose container runtime is a fake CRI, so no container runs.
// Every component listens on loopback only.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// BinDirEnv names the directory that holds the test-bed binaries built by
// hack/testbed-bins.sh.
const BinDirEnv = "PRISM_TESTBED_BIN"

// Options configure a cluster.
type Options struct {
	// BinDir holds etcd, kube-apiserver, kube-controller-manager,
	// kube-scheduler, kubelet and kubectl. Defaults to $PRISM_TESTBED_BIN.
	BinDir string
	// WorkDir receives certificates, kubeconfigs, node state and logs.
	WorkDir string
	// CRDDirs are installed before Start returns.
	CRDDirs []string
	// FeatureGates are passed to every component.
	FeatureGates map[string]bool
	// RuntimeConfig is passed to kube-apiserver's --runtime-config.
	RuntimeConfig []string
	// ExtraAPIServerArgs override or add kube-apiserver flags.
	ExtraAPIServerArgs map[string]string
	// StandInImage, when set, is the locally imported image that stand-in
	// pods run, never pulled. A real runtime needs it: the default image
	// would send containerd to a registry. The fake CRI accepts any name.
	StandInImage string
}

// Cluster is a running control plane plus the nodes added to it.
type Cluster struct {
	opts           Options
	env            *envtest.Environment
	Config         *rest.Config
	Client         kubernetes.Interface
	KubeconfigPath string
	procs          []*Process

	mu            sync.Mutex // nodes may be added concurrently
	nodes         []*Node
	holdsHostDirs bool
}

// BinDir resolves the test-bed binary directory or says how to build it.
func BinDir(explicit string) (string, error) {
	dir := explicit
	if dir == "" {
		dir = os.Getenv(BinDirEnv)
	}
	if dir == "" {
		return "", fmt.Errorf("%s is not set: build the test bed with hack/testbed-bins.sh (make testbed) and export %s to the directory it prints", BinDirEnv, BinDirEnv)
	}
	for _, b := range []string{"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl"} {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return "", fmt.Errorf("test-bed binary %s missing in %s: run hack/testbed-bins.sh", b, dir)
		}
	}
	return dir, nil
}

// Start starts etcd, kube-apiserver, kube-scheduler and kube-controller-manager
// and returns once the default ServiceAccount exists, so that pods can be created.
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	logger := klog.FromContext(ctx)
	binDir, err := BinDir(opts.BinDir)
	if err != nil {
		return nil, err
	}
	opts.BinDir = binDir
	if opts.WorkDir == "" {
		return nil, errors.New("start test bed: WorkDir is required")
	}
	if err := os.MkdirAll(filepath.Join(opts.WorkDir, "logs"), 0o755); err != nil {
		return nil, fmt.Errorf("start test bed: %w", err)
	}
	c := &Cluster{opts: opts}
	defer func() {
		if err != nil {
			c.Stop(ctx)
		}
	}()
	start := time.Now()

	etcdLog, err := os.Create(filepath.Join(opts.WorkDir, "logs", "etcd.log"))
	if err != nil {
		return nil, err
	}
	apiLog, err := os.Create(filepath.Join(opts.WorkDir, "logs", "kube-apiserver.log"))
	if err != nil {
		return nil, err
	}
	// Fixed directories, rather than envtest's temporary ones, keep the
	// serving certificates and etcd's data across RestartAPIServer and
	// RestartEtcd.
	certDir, dataDir := filepath.Join(opts.WorkDir, "apiserver"), filepath.Join(opts.WorkDir, "etcd")
	for _, d := range []string{certDir, dataDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("start test bed: %w", err)
		}
	}
	api := &envtest.APIServer{Out: apiLog, Err: apiLog, CertDir: certDir}
	args := api.Configure()
	// Without this the apiserver loops on reconciling the kubernetes Service
	// endpoints for a loopback address it is not allowed to publish.
	args.Set("endpoint-reconciler-type", "none")
	args.Set("kubelet-preferred-address-types", "Hostname,InternalIP")
	args.Set("authorization-mode", "Node,RBAC")
	if fg := featureGateFlag(opts.FeatureGates); fg != "" {
		args.Set("feature-gates", fg)
	}
	if len(opts.RuntimeConfig) > 0 {
		args.Set("runtime-config", strings.Join(opts.RuntimeConfig, ","))
	}
	for k, v := range opts.ExtraAPIServerArgs {
		args.Set(k, v)
	}
	c.env = &envtest.Environment{
		BinaryAssetsDirectory: binDir,
		CRDDirectoryPaths:     opts.CRDDirs,
		ErrorIfCRDPathMissing: true,
		ControlPlane: envtest.ControlPlane{
			Etcd:      &envtest.Etcd{Out: etcdLog, Err: etcdLog, DataDir: dataDir},
			APIServer: api,
		},
		ControlPlaneStartTimeout: time.Minute,
		ControlPlaneStopTimeout:  30 * time.Second,
	}
	if _, err := c.env.Start(); err != nil {
		return nil, fmt.Errorf("start etcd and kube-apiserver (logs in %s): %w", filepath.Join(opts.WorkDir, "logs"), err)
	}
	admin, err := c.env.AddUser(envtest.User{Name: "prism-testbed-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("provision test-bed admin: %w", err)
	}
	c.Config = admin.Config()
	c.Config.QPS, c.Config.Burst = 200, 400
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("render admin kubeconfig: %w", err)
	}
	c.KubeconfigPath = filepath.Join(opts.WorkDir, "kubeconfig")
	if err := os.WriteFile(c.KubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("write admin kubeconfig: %w", err)
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}

	common := []string{"--kubeconfig=" + c.KubeconfigPath, "--leader-elect=false", "--secure-port=0", "--v=2"}
	if fg := featureGateFlag(opts.FeatureGates); fg != "" {
		common = append(common, "--feature-gates="+fg)
	}
	sched, err := c.startComponent(ctx, "kube-scheduler", common...)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, sched)
	kcm, err := c.startComponent(ctx, "kube-controller-manager", append(common,
		"--controllers=*",
		"--use-service-account-credentials=false",
		"--root-ca-file="+filepath.Join(api.CertDir, "apiserver.crt"),
	)...)
	if err != nil {
		return nil, err
	}
	c.procs = append(c.procs, kcm)

	if err := c.waitForDefaultServiceAccount(ctx); err != nil {
		return nil, err
	}
	logger.Info("Test-bed control plane ready", "elapsed", time.Since(start).Round(time.Millisecond), "kubeconfig", c.KubeconfigPath)
	return c, nil
}

func (c *Cluster) startComponent(ctx context.Context, name string, args ...string) (*Process, error) {
	dir := filepath.Join(c.opts.WorkDir, "run", name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return StartProcess(ctx, name, dir, filepath.Join(c.opts.WorkDir, "logs", name+".log"), filepath.Join(c.opts.BinDir, name), args...)
}

func (c *Cluster) waitForDefaultServiceAccount(ctx context.Context) error {
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, p := range c.procs {
			if exited, err := p.Exited(); exited {
				return false, fmt.Errorf("%s exited early (%v), see %s", p.Name, err, p.LogPath)
			}
		}
		_, err := c.Client.CoreV1().ServiceAccounts(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		return fmt.Errorf("wait for the default ServiceAccount (is kube-controller-manager running?): %w", err)
	}
	return nil
}

// RestartAPIServer stops kube-apiserver (SIGTERM, then SIGKILL after the
// grace period, as a rolling restart would) and starts it again on the
// same port, certificates and client CA, so that every kubeconfig handed
// out stays valid. It returns once the new server answers /healthz.
func (c *Cluster) RestartAPIServer(ctx context.Context) error {
	return c.restart(ctx, "kube-apiserver", c.env.ControlPlane.APIServer)
}

// RestartEtcd stops etcd and starts it again on the same URL and data, so
// that kube-apiserver sees its storage go away and come back.
func (c *Cluster) RestartEtcd(ctx context.Context) error {
	return c.restart(ctx, "etcd", c.env.ControlPlane.Etcd)
}

// restart stops a control-plane process and starts it again with the
// same configuration; name is also the base name of its log.
func (c *Cluster) restart(ctx context.Context, name string, p interface {
	Start() error
	Stop() error
}) error {
	if err := p.Stop(); err != nil {
		// envtest has sent SIGKILL once the grace period ran out; the
		// process is reaped, and its port freed, a moment later.
		klog.FromContext(ctx).Info(name+" did not stop within its grace period", "err", err)
		time.Sleep(2 * time.Second)
	}
	if err := p.Start(); err != nil {
		return fmt.Errorf("start %s again (log %s): %w", name, filepath.Join(c.opts.WorkDir, "logs", name+".log"), err)
	}
	return nil
}

// Nodes are the nodes added so far, in the order they were added; nodes
// added concurrently come in the order their kubelets started.
func (c *Cluster) Nodes() []*Node {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.nodes)
}

// BinPath is the path of a test-bed binary such as kubectl.
func (c *Cluster) BinPath(name string) string { return filepath.Join(c.opts.BinDir, name) }

// WorkDir is where the cluster keeps its state and logs.
func (c *Cluster) WorkDir() string { return c.opts.WorkDir }

// LogFiles lists every component log, nodes included.
func (c *Cluster) LogFiles() []string {
	files, _ := filepath.Glob(filepath.Join(c.opts.WorkDir, "logs", "*.log"))
	sort.Strings(files)
	return files
}

// Stop stops the nodes, then the control plane. It is safe to call twice.
func (c *Cluster) Stop(ctx context.Context) {
	logger := klog.FromContext(ctx)
	c.mu.Lock()
	nodes := c.nodes
	c.nodes = nil
	c.mu.Unlock()
	for i := len(nodes) - 1; i >= 0; i-- {
		nodes[i].Stop(ctx)
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		_ = c.procs[i].Stop(10 * time.Second)
	}
	c.procs = nil
	if c.env != nil {
		if err := c.env.Stop(); err != nil {
			logger.Error(err, "Stopping etcd and kube-apiserver")
		}
		c.env = nil
	}
	c.mu.Lock()
	holds := c.holdsHostDirs
	c.holdsHostDirs = false
	c.mu.Unlock()
	if holds {
		hostDirs.release(ctx)
	}
}

func featureGateFlag(gates map[string]bool) string {
	var parts []string
	for k, v := range gates {
		parts = append(parts, k+"="+strconv.FormatBool(v))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// FreePort asks the kernel for a free loopback TCP port.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// WaitForPod waits until cond holds for the pod, and returns it.
func WaitForPod(ctx context.Context, client kubernetes.Interface, namespace, name string, timeout time.Duration, cond func(*corev1.Pod) (bool, error)) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		pod = p
		return cond(p)
	})
	if err != nil {
		phase := "absent"
		if pod != nil {
			phase = describePod(pod)
		}
		return pod, fmt.Errorf("wait for pod %s/%s (%s): %w", namespace, name, phase, err)
	}
	return pod, nil
}

// PodRunning is a WaitForPod condition.
func PodRunning(p *corev1.Pod) (bool, error) {
	if p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded {
		return false, fmt.Errorf("pod ended in phase %s", p.Status.Phase)
	}
	return p.Status.Phase == corev1.PodRunning, nil
}

func describePod(p *corev1.Pod) string {
	s := fmt.Sprintf("phase %s", p.Status.Phase)
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Message != "" {
			s += fmt.Sprintf(", %s: %s", c.Type, c.Message)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			s += fmt.Sprintf(", container %s waiting: %s %s", cs.Name, w.Reason, w.Message)
		}
	}
	return s
}

// Kubectl runs the test bed's kubectl against the cluster and returns its
// combined output.
func Kubectl(ctx context.Context, c *Cluster, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.BinPath("kubectl"), append([]string{"--kubeconfig=" + c.KubeconfigPath}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}
