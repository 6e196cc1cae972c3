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
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/template"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/util/wait"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/klog/v2"
)

// ContainerdOptions make a node run its pods in real containers: containerd
// with runc and CDI, instead of the fake CRI.
type ContainerdOptions struct {
	// CDISpecDirs are where containerd reads CDI specs, such as the
	// directory a DRA driver on this node writes to.
	CDISpecDirs []string
	// Images are OCI archives imported into containerd's k8s.io namespace
	// before the kubelet starts. Nothing is ever pulled.
	Images []string
	// SandboxImage is the pause image's reference; it must be among Images.
	SandboxImage string
}

// Containerd is one node's containerd. It lives in a mount namespace of its
// own that the node's kubelet joins, so that the volumes the kubelet mounts
// are the ones the containers get, and so that the paths containerd
// hard-codes (/run/containerd for shim sockets and runc state) are private
// tmpfs mounts that vanish with it.
type Containerd struct {
	Dir         string
	Socket      string
	Snapshotter string

	proc   *Process
	binDir string
	runc   string
}

// containerdPrivateDirs are host paths containerd and its shims use whatever
// the configuration says.
var containerdPrivateDirs = []string{"/run/containerd"}

// cniBinDir is where Debian's containernetworking-plugins installs loopback.
const cniBinDir = "/usr/lib/cni"

// containerdBinaries are built by hack/testbed-bins.sh next to the kubelet.
var containerdBinaries = []string{"containerd", "containerd-shim-runc-v2", "ctr"}

// startContainerd starts containerd for node n, waits until its CRI says the
// runtime and the network are ready, and imports the images.
func startContainerd(ctx context.Context, n *Node, opts ContainerdOptions) (_ *Containerd, err error) {
	logger := klog.FromContext(ctx)
	binDir := n.cluster.opts.BinDir
	for _, b := range containerdBinaries {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("test-bed binary %s missing in %s: run hack/testbed-bins.sh", b, binDir)
		}
	}
	runc, err := exec.LookPath("runc")
	if err != nil {
		return nil, fmt.Errorf("runc not found (hack/testbed-bins.sh installs Debian's runc): %w", err)
	}
	if _, err := os.Stat(filepath.Join(cniBinDir, "loopback")); err != nil {
		return nil, fmt.Errorf("CNI loopback plugin missing (hack/testbed-bins.sh installs Debian's containernetworking-plugins): %w", err)
	}
	if opts.SandboxImage == "" {
		return nil, errors.New("start containerd: a sandbox (pause) image is required")
	}
	c := &Containerd{Dir: filepath.Join(n.Dir, "containerd"), binDir: binDir, runc: runc}
	c.Socket = filepath.Join(c.Dir, "containerd.sock")
	for _, d := range []string{"root", "state", "cni", "opt", "certs.d"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o711); err != nil {
			return nil, fmt.Errorf("start containerd: %w", err)
		}
	}
	c.Snapshotter = "native"
	if err := probeOverlay(filepath.Join(c.Dir, "root")); err == nil {
		c.Snapshotter = "overlayfs"
	} else {
		logger.Info("Overlay mounts unavailable, containerd uses the native snapshotter", "reason", err.Error())
	}
	if err := c.writeConfig(opts); err != nil {
		return nil, err
	}
	// Loopback only: pods on the test bed use the host network, and a
	// bridge would put private-range addresses on the host.
	cni := `{"cniVersion": "1.0.0", "name": "prism-testbed-loopback", "plugins": [{"type": "loopback"}]}` + "\n"
	if err := os.WriteFile(filepath.Join(c.Dir, "cni", "10-loopback.conflist"), []byte(cni), 0o644); err != nil {
		return nil, fmt.Errorf("start containerd: %w", err)
	}

	private := append(append([]string{}, kubeletPrivateDirs...), containerdPrivateDirs...)
	script := "set -e\nfor d in " + strings.Join(private, " ") + "; do mount -t tmpfs tmpfs \"$d\"; done\nexec \"$@\"\n"
	args := []string{"--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, "containerd",
		filepath.Join(binDir, "containerd"), "--config=" + filepath.Join(c.Dir, "config.toml")}
	// The shim is found on PATH.
	env := []string{"PATH=" + binDir + string(os.PathListSeparator) + os.Getenv("PATH")}
	c.proc, err = StartProcessWithEnv(ctx, "containerd-"+n.Name, c.Dir,
		filepath.Join(n.cluster.opts.WorkDir, "logs", "containerd-"+n.Name+".log"), env, "unshare", args...)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Stop(ctx)
		}
	}()
	if err := c.waitReady(ctx, time.Minute); err != nil {
		return nil, err
	}
	for _, img := range opts.Images {
		if out, err := c.Ctr(ctx, "images", "import", "--snapshotter="+c.Snapshotter, img); err != nil {
			return nil, fmt.Errorf("import %s into containerd: %w\n%s", img, err, out)
		}
	}
	if out, err := c.Ctr(ctx, "images", "check", "name=="+opts.SandboxImage); err != nil || !strings.Contains(out, opts.SandboxImage) {
		return nil, fmt.Errorf("sandbox image %s is not among the imported images (%v):\n%s", opts.SandboxImage, err, out)
	}
	logger.Info("Containerd ready", "node", n.Name, "socket", c.Socket, "snapshotter", c.Snapshotter, "images", len(opts.Images))
	return c, nil
}

var containerdConfig = template.Must(template.New("config").Parse(`version = 3
root = {{printf "%q" .Root}}
state = {{printf "%q" .State}}

[grpc]
  address = {{printf "%q" .Socket}}

[plugins.'io.containerd.internal.v1.opt']
  path = {{printf "%q" .Opt}}

[plugins.'io.containerd.nri.v1.nri']
  disable = true

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = {{printf "%q" .Snapshotter}}
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = {{printf "%q" .SandboxImage}}
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = {{printf "%q" .CertsDir}}

[plugins.'io.containerd.cri.v1.runtime']
  enable_cdi = true
  # The kubelet asks for a negative oom_score_adj for sandboxes (-998),
  # which sandboxed build machines refuse even to root; runc then fails
  # with "can't get final child's PID from pipe". Clamp to containerd's own.
  restrict_oom_score_adj = true
  cdi_spec_dirs = [{{range $i, $d := .CDISpecDirs}}{{if $i}}, {{end}}{{printf "%q" $d}}{{end}}]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = {{printf "%q" .Runc}}
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [{{printf "%q" .CNIBinDir}}]
    conf_dir = {{printf "%q" .CNIConfDir}}
`))

func (c *Containerd) writeConfig(opts ContainerdOptions) error {
	var b strings.Builder
	err := containerdConfig.Execute(&b, map[string]any{
		"Root":         filepath.Join(c.Dir, "root"),
		"State":        filepath.Join(c.Dir, "state"),
		"Socket":       c.Socket,
		"Opt":          filepath.Join(c.Dir, "opt"),
		"Snapshotter":  c.Snapshotter,
		"SandboxImage": opts.SandboxImage,
		"CertsDir":     filepath.Join(c.Dir, "certs.d"),
		"CDISpecDirs":  opts.CDISpecDirs,
		"Runc":         c.runc,
		"CNIBinDir":    cniBinDir,
		"CNIConfDir":   filepath.Join(c.Dir, "cni"),
	})
	if err != nil {
		return fmt.Errorf("render containerd config: %w", err)
	}
	return os.WriteFile(filepath.Join(c.Dir, "config.toml"), []byte(b.String()), 0o644)
}

// waitReady waits for the CRI to report both RuntimeReady and NetworkReady,
// which the kubelet needs to call the node Ready.
func (c *Containerd) waitReady(ctx context.Context, timeout time.Duration) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if exited, err := c.proc.Exited(); exited {
			return false, fmt.Errorf("containerd exited (%v), see %s", err, c.proc.LogPath)
		}
		if _, err := os.Stat(c.Socket); err != nil {
			last = "no socket yet"
			return false, nil
		}
		var ready bool
		err := c.withCRI(ctx, func(rt runtimeapi.RuntimeServiceClient) error {
			resp, err := rt.Status(ctx, &runtimeapi.StatusRequest{})
			if err != nil {
				return err
			}
			ready = true
			last = ""
			for _, cond := range resp.GetStatus().GetConditions() {
				if !cond.GetStatus() {
					ready = false
					last += fmt.Sprintf("%s: %s %s; ", cond.GetType(), cond.GetReason(), cond.GetMessage())
				}
			}
			return nil
		})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		return ready, nil
	})
	if err != nil {
		return fmt.Errorf("wait for containerd's CRI to be ready (last: %s, log %s): %w", last, c.proc.LogPath, err)
	}
	return nil
}

func (c *Containerd) withCRI(ctx context.Context, f func(runtimeapi.RuntimeServiceClient) error) error {
	conn, err := grpc.NewClient("unix://"+c.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", c.Socket, err)
	}
	defer conn.Close()
	return f(runtimeapi.NewRuntimeServiceClient(conn))
}

// Ctr runs containerd's ctr against this containerd in the k8s.io namespace,
// where the CRI keeps its images and containers.
func (c *Containerd) Ctr(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "ctr"), append([]string{"--address=" + c.Socket, "--namespace=k8s.io"}, args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ctr %s: %w", strings.Join(args, " "), err)
	}
	return string(out), nil
}

// mountNamespace is the namespace the kubelet has to join.
func (c *Containerd) mountNamespace() string {
	return filepath.Join("/proc", strconv.Itoa(c.proc.Pid()), "ns", "mnt")
}

// AgentCommand is how to start a node agent, such as a DRA plugin, that
// runs beside the kubelet: in the runtime's mount namespace when the node
// runs containerd, where the kubelet runs too. On a real node the agent,
// the kubelet and the runtime share one view of the host, so the mounts an
// agent makes under its state directory (the plugin's tmpfs report
// directories) are the ones the runtime bind-mounts into containers; from
// the test's own namespace they would be invisible to containers.
func (n *Node) AgentCommand(name string, args ...string) (string, []string) {
	if n.Containerd == nil {
		return name, args
	}
	return "nsenter", append([]string{"--mount=" + n.Containerd.mountNamespace(), "--", name}, args...)
}

// ViewPath is path as the node's agents and containers see it, readable
// from the test: through the runtime's mount namespace when the node runs
// containerd.
func (n *Node) ViewPath(path string) string {
	if n.Containerd == nil {
		return path
	}
	return filepath.Join("/proc", strconv.Itoa(n.Containerd.proc.Pid()), "root", path)
}

// Stop removes every pod sandbox, so that runc kills the containers and the
// shims exit, then stops containerd. The shims are not children of the
// containerd process group; any that outlive the removal are killed by the
// pid containerd recorded for them.
func (c *Containerd) Stop(ctx context.Context) {
	if c.proc == nil {
		return
	}
	logger := klog.FromContext(ctx)
	if exited, _ := c.proc.Exited(); !exited {
		stopCtx, cancel := context.WithTimeout(ctx, time.Minute)
		err := c.withCRI(stopCtx, func(rt runtimeapi.RuntimeServiceClient) error {
			list, err := rt.ListPodSandbox(stopCtx, &runtimeapi.ListPodSandboxRequest{})
			if err != nil {
				return err
			}
			var errs []error
			for _, s := range list.GetItems() {
				if _, err := rt.StopPodSandbox(stopCtx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
					errs = append(errs, err)
				}
				if _, err := rt.RemovePodSandbox(stopCtx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: s.GetId()}); err != nil {
					errs = append(errs, err)
				}
			}
			return errors.Join(errs...)
		})
		cancel()
		if err != nil {
			logger.Error(err, "Removing pod sandboxes from containerd", "log", c.proc.LogPath)
		}
	}
	_ = c.proc.Stop(10 * time.Second)
	pids, _ := filepath.Glob(filepath.Join(c.Dir, "state", "io.containerd.runtime.v2.task", "*", "*", "shim.pid"))
	for _, f := range pids {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil && pid > 1 {
			logger.Info("Killing a shim left behind", "pid", pid, "pidfile", f)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	c.proc = nil
}

// probeOverlay mounts and unmounts a throwaway overlay under dir, which is
// what containerd's overlayfs snapshotter needs from the filesystem.
func probeOverlay(dir string) error {
	tmp, err := os.MkdirTemp(dir, "overlay-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{"lower", "upper", "work", "merged"} {
		if err := os.Mkdir(filepath.Join(tmp, d), 0o755); err != nil {
			return err
		}
	}
	data := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", filepath.Join(tmp, "lower"), filepath.Join(tmp, "upper"), filepath.Join(tmp, "work"))
	merged := filepath.Join(tmp, "merged")
	if err := unix.Mount("overlay", merged, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", merged, err)
	}
	return unix.Unmount(merged, 0)
}
