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

package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/prismgpu/prism/hack/tools/imagebuild/recipe"
	"github.com/prismgpu/prism/test/testbed"
)

// requireRoot skips tests that chroot into an image's root filesystem:
// that needs root. CI runs make test as root, so there they run.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("running a command inside an image's root filesystem needs chroot, which needs root; CI runs as root")
	}
}

// rootfs unpacks an image as a container runtime would.
func rootfs(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	if err := unpack(image(t, name), dir); err != nil {
		t.Fatalf("unpacking %s: %v", name, err)
	}
	return dir
}

// unpack writes the image's root filesystem into dir, with owners and
// modes.
func unpack(img v1.Image, dir string) error {
	return walk(img, func(h *tar.Header, r io.Reader) error {
		name := filepath.Clean(h.Name)
		if name == ".." || strings.HasPrefix(name, "../") || filepath.IsAbs(name) {
			return fmt.Errorf("layer entry %q escapes the root", h.Name)
		}
		p := filepath.Join(dir, name)
		// The flattened filesystem lists the top layer first, so a file
		// can come before the lower layer's entry for its directory.
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			_ = os.Remove(p)
			f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, r)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		case tar.TypeSymlink:
			_ = os.Remove(p)
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
			return os.Lchown(p, h.Uid, h.Gid)
		default:
			return fmt.Errorf("unsupported entry type %q", h.Typeflag)
		}
		if err := os.Chmod(p, h.FileInfo().Mode()); err != nil {
			return err
		}
		return os.Lchown(p, h.Uid, h.Gid)
	})
}

// run executes argv inside root as user ("uid:gid"), with the image's
// environment plus env, and returns stdout and stderr together.
func run(ctx context.Context, t *testing.T, root, user string, imageEnv, env []string, argv ...string) (string, error) {
	t.Helper()
	uidStr, gidStr, _ := strings.Cut(user, ":")
	uid, err := strconv.ParseUint(uidStr, 10, 32)
	if err != nil {
		t.Fatalf("user %q: %v", user, err)
	}
	gid, err := strconv.ParseUint(gidStr, 10, 32)
	if err != nil {
		t.Fatalf("user %q: %v", user, err)
	}
	cmd := exec.CommandContext(ctx, lookPath(t, root, imageEnv, argv[0]), argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = append(append([]string{}, imageEnv...), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err = cmd.Run()
	return out.String(), err
}

// lookPath finds a command on the image's PATH, as the runtime does when a
// container's command is a bare name.
func lookPath(t *testing.T, root string, imageEnv []string, name string) string {
	t.Helper()
	if strings.Contains(name, "/") {
		return name
	}
	for _, e := range imageEnv {
		if dirs, ok := strings.CutPrefix(e, "PATH="); ok {
			for _, dir := range filepath.SplitList(dirs) {
				if _, err := os.Lstat(filepath.Join(root, dir, name)); err == nil {
					return filepath.Join(dir, name)
				}
			}
		}
	}
	t.Fatalf("%s is not on the image's PATH", name)
	return ""
}

func TestEntrypointsRunInsideTheirImage(t *testing.T) {
	requireRoot(t)
	o, _ := images(t)
	hookVersion := image(t, "prism-kubelet-plugin").Config.Labels["dev.prism.nvidia-cdi-hook.version"]
	for _, tc := range []struct {
		image string
		// argv empty means the image's entrypoint with --version.
		argv []string
		want []string
	}{
		{image: "prism-kubelet-plugin", want: []string{"prism-kubelet-plugin version " + o.Version, "revision " + o.Revision}},
		{image: "prism-controller", want: []string{"prism-controller version " + o.Version, "revision " + o.Revision}},
		{image: "prism-kubelet-plugin", argv: []string{"/usr/bin/nvidia-cdi-hook", "--version"}, want: []string{"version " + hookVersion}},
		{image: "pause", want: []string{"pause"}},
		{image: "workload", argv: []string{"/bin/sh", "-c", "env; ls /bin/sh; cat /etc/passwd; sleep 0; echo done"}, want: []string{"PATH=/usr/local/sbin", "/bin/sh", "root:x:0:0", "done"}},
		// Dynamically linked: it runs only if the image's glibc loader and
		// libc are in place, as a profiled workload needs.
		{image: "workload", argv: []string{"/bin/dash", "-c", "echo dash runs on glibc"}, want: []string{"dash runs on glibc"}},
	} {
		cfg := image(t, tc.image).Config
		argv := tc.argv
		if argv == nil {
			argv = append(append([]string{}, cfg.Entrypoint...), "--version")
		}
		t.Run(tc.image+" "+filepath.Base(argv[0]), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := run(ctx, t, rootfs(t, tc.image), cfg.User, cfg.Env, nil, argv...)
			if err != nil {
				t.Fatalf("%s as %s: %v\n%s", argv, cfg.User, err, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("%s printed %q, want it to contain %q", argv, out, w)
				}
			}
		})
	}
}

func TestPauseExitsOnSIGTERM(t *testing.T) {
	requireRoot(t)
	cfg := image(t, "pause").Config
	uid, _ := strconv.Atoi(strings.Split(cfg.User, ":")[0])
	cmd := exec.Command(cfg.Entrypoint[0])
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: rootfs(t, "pause"), Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(uid)}}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Before pause has asked for SIGTERM, Go's default action would kill
	// it; it says when it has.
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		t.Fatalf("pause exited before waiting for SIGTERM: %v", err)
	}
	if !strings.Contains(line, "waiting for SIGTERM") {
		t.Errorf("pause printed %q", line)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		t.Errorf("pause after SIGTERM: %v, want exit 0", err)
	}
}

// The chart's init containers run the plugin image's busybox: their
// scripts must find every command they use there.
func TestChartInitContainersRunInThePluginImage(t *testing.T) {
	requireRoot(t)
	init, plugin := pluginContainers(t)
	cfg := image(t, "prism-kubelet-plugin").Config

	// The installers copy a file from the image to the host path the
	// plugin is told about.
	for _, tc := range []struct {
		container, variable, from, pluginEnv string
		mode                                 os.FileMode
	}{
		{"install-cdi-hook", "HOOK", "usr/bin/nvidia-cdi-hook", "PRISM_NVIDIA_CDI_HOOK_PATH", 0o755},
		{"install-profiling-shim", "SHIM", recipe.ProfilingShimPath, "PRISM_PROFILING_SHIM", 0o644},
	} {
		t.Run(tc.container, func(t *testing.T) {
			c := init[tc.container]
			root := rootfs(t, "prism-kubelet-plugin")
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			out, err := run(ctx, t, root, "0:0", cfg.Env, env(c), c.Command...)
			if err != nil {
				t.Fatalf("%v: %v\n%s", c.Command, err, out)
			}
			var dest string
			for _, e := range c.Env {
				if e.Name == tc.variable {
					dest = e.Value
				}
			}
			if dest == "" || dest != plugin[tc.pluginEnv] {
				t.Errorf("%s installs to %s=%q, the plugin's %s=%q", tc.container, tc.variable, dest, tc.pluginEnv, plugin[tc.pluginEnv])
			}
			got, err := os.ReadFile(filepath.Join(root, dest))
			if err != nil {
				t.Fatalf("nothing installed: %v", err)
			}
			want, err := os.ReadFile(filepath.Join(root, tc.from))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("installed %s differs from the image's /%s", dest, tc.from)
			}
			if st, err := os.Stat(filepath.Join(root, dest)); err != nil || st.Mode().Perm() != tc.mode {
				t.Errorf("installed %s mode %v (%v), want %v", dest, st.Mode(), err, tc.mode)
			}
		})
	}

	t.Run("wait-for-driver", func(t *testing.T) {
		c := init["wait-for-driver"]
		root := rootfs(t, "prism-kubelet-plugin")
		driverRoot := envMap(c)["ROOT"]
		lib := filepath.Join(root, driverRoot, "usr/lib", libTriplet(), "libnvidia-ml.so.1")
		if err := os.MkdirAll(filepath.Dir(lib), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(lib, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		out, err := run(ctx, t, root, "0:0", cfg.Env, env(c), c.Command...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.Command, err, out)
		}
		if !strings.Contains(out, "NVIDIA driver found") {
			t.Errorf("wait-for-driver printed %q, want it to report the driver found", out)
		}
	})
}

func env(c corev1.Container) []string {
	var env []string
	for _, e := range c.Env {
		env = append(env, e.Name+"="+e.Value)
	}
	return env
}

// pluginContainers renders the chart for real GPUs (no simulated fleet),
// where the plugin has all its init containers, and returns them by name
// with the plugin container's environment.
func pluginContainers(t *testing.T) (map[string]corev1.Container, map[string]string) {
	t.Helper()
	dir := os.Getenv(testbed.BinDirEnv)
	if dir == "" {
		t.Fatalf("%s is not set: build the test bed with hack/testbed-bins.sh (make testbed) and export %s to the directory it prints", testbed.BinDirEnv, testbed.BinDirEnv)
	}
	cmd := exec.Command(filepath.Join(dir, "helm"), "template", "prism", filepath.Join(repoRoot, "deployments/helm/prism"),
		"--namespace", "prism-system", "--kube-version", "1.34.0", "--show-only", "templates/kubelet-plugin-daemonset.yaml")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, stderr.String())
	}
	doc, err := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out))).Read()
	if err != nil {
		t.Fatal(err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal(doc, &ds); err != nil {
		t.Fatal(err)
	}
	init := map[string]corev1.Container{}
	for _, c := range ds.Spec.Template.Spec.InitContainers {
		if c.Image != ds.Spec.Template.Spec.Containers[0].Image {
			t.Errorf("init container %s runs %s, not the plugin image", c.Name, c.Image)
		}
		init[c.Name] = c
	}
	for _, name := range []string{"install-cdi-hook", "install-profiling-shim", "wait-for-driver"} {
		if _, ok := init[name]; !ok {
			t.Fatalf("chart renders no init container %s", name)
		}
	}
	return init, envMap(ds.Spec.Template.Spec.Containers[0])
}

func envMap(c corev1.Container) map[string]string {
	m := map[string]string{}
	for _, e := range c.Env {
		m[e.Name] = e.Value
	}
	return m
}

// Building again from the same checkout, without the cache, gives the same
// bytes: binaries relinked, layers recompressed, archive rewritten.
func TestRebuildWithoutCacheIsByteIdentical(t *testing.T) {
	o, archives := images(t)
	o.NoCache = true
	o.Log = nil
	names := []string{"prism-controller", "pause"}
	dir := t.TempDir()
	results, err := recipe.Build(context.Background(), o, names, func(n string) string { return filepath.Join(dir, n+".tar") })
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if want := archives[r.Name].Digest; r.Digest != want {
			t.Errorf("%s rebuilt without the cache: digest %s, first build %s", r.Name, r.Digest, want)
		}
		first, err := os.ReadFile(filepath.Join(outDir, r.Name+".tar"))
		if err != nil {
			t.Fatal(err)
		}
		again, err := os.ReadFile(r.Path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(first, again) {
			t.Errorf("%s: the archives differ byte for byte", r.Name)
		}
	}
}
