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

// Command prism-demo runs the Prism demo on the local test bed.
//
//	prism-demo up    build the binaries, start the demo cluster as a daemon
//	prism-demo run   apply demo/specs and print where every pod landed and why
//	prism-demo down  stop the daemon and check that nothing is left
//
// The kubelets' container runtimes are fake CRI servers living inside the
// process that started the cluster, so the cluster lives in a daemon that
// `up` starts detached and `down` signals.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/demo/scenario"
	"github.com/prismgpu/prism/test/testbed"
)

const (
	// workDir is short on purpose: unix socket paths are limited to 108 bytes.
	workDir   = "/tmp/prism-demo"
	stateName = "demo.json"
	readyName = "ready"
)

// state is what the daemon publishes for run and down.
type state struct {
	Pid        int               `json:"pid"`
	WorkDir    string            `json:"workDir"`
	Kubeconfig string            `json:"kubeconfig"`
	StateDirs  map[string]string `json:"stateDirs"`
	// FaultsFiles are the plugins' --simulated-faults files.
	FaultsFiles map[string]string `json:"faultsFiles,omitempty"`
	Kubectl     string            `json:"kubectl"`
	Prismctl    string            `json:"prismctl"`
	Log         string            `json:"log"`
	StartedAt   time.Time         `json:"startedAt"`
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "up":
		err = up()
	case "run":
		err = run()
	case "down":
		err = down()
	case "daemon":
		err = daemon()
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "prism-demo %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: prism-demo up|run|down")
	os.Exit(2)
}

func logf(format string, args ...any) { fmt.Printf("[prism-demo] "+format+"\n", args...) }

// repoRoot finds the module root from the working directory.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/prismgpu/prism\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("run prism-demo from inside the Prism repository")
		}
		dir = parent
	}
}

func readState() (*state, error) {
	data, err := os.ReadFile(filepath.Join(workDir, stateName))
	if err != nil {
		return nil, err
	}
	var s state
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("read %s: %w", filepath.Join(workDir, stateName), err)
	}
	return &s, nil
}

func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// A zombie has exited; only its parent has not reaped it yet.
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

func up() error {
	start := time.Now()
	if os.Geteuid() != 0 {
		return errors.New("the demo runs real kubelets, which mount and manage cgroups: run it as root (sudo make demo)")
	}
	if s, err := readState(); err == nil {
		if alive(s.Pid) {
			return fmt.Errorf("a demo is already running (daemon pid %d, kubeconfig %s): run the scenarios again with `go run ./demo/cmd/prism-demo run`, or stop it with `make demo-down`", s.Pid, s.Kubeconfig)
		}
		return fmt.Errorf("%s holds the state of a demo whose daemon (pid %d) is gone: run `make demo-down` to clean up", workDir, s.Pid)
	}
	if _, err := os.Stat(workDir); err == nil {
		return fmt.Errorf("%s is taken (a demo that did not finish starting, or something else): run `make demo-down`, or remove it yourself if it is not the demo's", workDir)
	}
	for _, d := range []string{"/var/lib/kubelet", "/var/log/pods"} {
		if mounted(d) {
			return fmt.Errorf("%s is a mount point in this namespace: is a real kubelet running on this machine? The demo will not run beside one", d)
		}
	}
	binDir, err := testbed.BinDir("")
	if err != nil {
		return err
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	out := filepath.Join(root, "_output", "demo")
	logf("building prism-kubelet-plugin, prism-controller, prismctl and the stand-in ncu into %s", filepath.Join(out, "bin"))
	for _, b := range [][]string{
		{"build", "-tags", bed.PluginBuildTags, "-o", filepath.Join(out, "bin") + "/", "./cmd/prism-kubelet-plugin", "./cmd/prism-controller", "./cmd/prismctl"},
		{"build", "-o", filepath.Join(out, "bin", "ncu", "ncu"), "./test/tools/fake-ncu"},
	} {
		cmd := exec.Command("go", b...)
		cmd.Dir, cmd.Stdout, cmd.Stderr = root, os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go %s: %w", strings.Join(b, " "), err)
		}
	}
	logf("built in %s", time.Since(start).Round(100*time.Millisecond))

	if err := os.MkdirAll(workDir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(out, "daemon.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := exec.Command(self, "daemon")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), testbed.BinDirEnv+"="+binDir)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	logFile.Close()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	logf("demo daemon started (pid %d, log %s); starting the cluster in %s", cmd.Process.Pid, logPath, workDir)

	// Follow the daemon's progress lines until it is ready.
	var offset int64
	follow := func() {
		f, err := os.Open(logPath)
		if err != nil {
			return
		}
		defer f.Close()
		_, _ = f.Seek(offset, io.SeekStart)
		data, _ := io.ReadAll(f)
		if i := strings.LastIndexByte(string(data), '\n'); i >= 0 {
			data = data[:i+1]
			offset += int64(len(data))
			for _, line := range strings.Split(strings.TrimSuffix(string(data), "\n"), "\n") {
				if strings.HasPrefix(line, "[prism-demo]") {
					fmt.Println(line)
				}
			}
		}
	}
	deadline := time.After(8 * time.Minute)
	for {
		follow()
		if _, err := os.Stat(filepath.Join(workDir, readyName)); err == nil {
			break
		}
		select {
		case err := <-exited:
			follow()
			return fmt.Errorf("the demo daemon exited before it was ready (%v); see %s", err, logPath)
		case <-deadline:
			_ = syscall.Kill(cmd.Process.Pid, syscall.SIGTERM)
			return fmt.Errorf("the demo cluster was not ready after 8 minutes; stopping it, see %s", logPath)
		case <-time.After(250 * time.Millisecond):
		}
	}
	s, err := readState()
	if err != nil {
		return err
	}
	logf("demo cluster up in %s: daemon pid %d, kubeconfig %s", time.Since(start).Round(100*time.Millisecond), s.Pid, s.Kubeconfig)
	return nil
}

func mounted(dir string) bool {
	data, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == dir {
			return true
		}
	}
	return false
}

// daemon runs the cluster until SIGTERM, then stops it and removes workDir.
func daemon() (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	root, err := repoRoot()
	if err != nil {
		return err
	}
	out := filepath.Join(root, "_output", "demo")
	logf("starting etcd, kube-apiserver, kube-scheduler and kube-controller-manager")
	start := time.Now()
	cluster, err := testbed.Start(context.WithoutCancel(ctx), testbed.Options{WorkDir: workDir, CRDDirs: bed.CRDDirs(root)})
	cleanup := func() {
		if cluster != nil {
			cluster.Stop(context.Background())
		}
		if rmErr := os.RemoveAll(workDir); rmErr != nil {
			logf("removing %s: %v", workDir, rmErr)
		}
	}
	if err != nil {
		cleanup()
		return err
	}
	logf("control plane ready (%s)", time.Since(start).Round(100*time.Millisecond))
	b, err := bed.Setup(context.WithoutCancel(ctx), cluster, bed.Options{
		RepoRoot:      root,
		PluginBin:     filepath.Join(out, "bin", "prism-kubelet-plugin"),
		ControllerBin: filepath.Join(out, "bin", "prism-controller"),
		NCUDir:        filepath.Join(out, "bin", "ncu"),
		Nodes:         bed.DemoNodes,
		Log:           os.Stdout,
	})
	if err != nil {
		cleanup()
		return err
	}
	s := state{
		Pid: os.Getpid(), WorkDir: workDir, Kubeconfig: cluster.KubeconfigPath, StateDirs: b.StateDirs, FaultsFiles: b.FaultsFiles,
		Kubectl: cluster.BinPath("kubectl"), Prismctl: filepath.Join(out, "bin", "prismctl"),
		Log: filepath.Join(out, "daemon.log"), StartedAt: time.Now(),
	}
	data, _ := json.MarshalIndent(s, "", "  ")
	if err := os.WriteFile(filepath.Join(workDir, stateName), data, 0o644); err != nil {
		b.Stop()
		cleanup()
		return err
	}
	if err := os.WriteFile(filepath.Join(workDir, readyName), nil, 0o644); err != nil {
		b.Stop()
		cleanup()
		return err
	}
	logf("ready; waiting for SIGTERM (prism-demo down)")
	<-ctx.Done()
	logf("stopping: prism-controller and plugins, then kubelets and control plane")
	b.Stop()
	cleanup()
	logf("stopped and removed %s", workDir)
	return nil
}

func run() error {
	s, err := readState()
	if err != nil {
		return fmt.Errorf("no demo running (%v): start one with `make demo`", err)
	}
	if !alive(s.Pid) {
		return fmt.Errorf("the demo daemon (pid %d) is gone: run `make demo-down`, then `make demo`", s.Pid)
	}
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 50, 100
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := scenario.Run(ctx, scenario.Env{Config: cfg, StateDirs: s.StateDirs, FaultsFiles: s.FaultsFiles, RepoRoot: root, Log: os.Stdout}, filepath.Join(root, "demo", "specs"))
	fmt.Println()
	res.Print(os.Stdout)
	if err != nil {
		return err
	}
	fmt.Printf(`
The demo cluster keeps running. Kubeconfig: %[1]s
Try:
  %[2]s --kubeconfig %[1]s get pods,resourceclaims -n %[4]s -o wide
  %[3]s get gpus --kubeconfig %[1]s
  %[2]s --kubeconfig %[1]s describe resourceslices
  %[2]s --kubeconfig %[1]s get workloadprofiles -n %[4]s
  %[3]s explain claim $(%[2]s --kubeconfig %[1]s get resourceclaims -n %[4]s -o name | grep memory-bound | cut -d/ -f2) -n %[4]s --kubeconfig %[1]s
Logs of every component: %[5]s/logs. Stop it all with: make demo-down
`, s.Kubeconfig, s.Kubectl, s.Prismctl, scenario.Namespace, s.WorkDir)
	if failed := res.Failed(); len(failed) > 0 {
		return fmt.Errorf("%d scenario(s) missed their expectation: %s", len(failed), strings.Join(failed, ", "))
	}
	return nil
}

// leftovers lists processes of the daemon's session (it called setsid, so
// its session ID is its pid; etcd and kube-apiserver keep their data outside
// workDir) and any process whose command line mentions workDir.
func leftovers(sid int) []string {
	entries, _ := os.ReadDir("/proc")
	var out []string
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		data, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(data) == 0 {
			continue
		}
		if !strings.Contains(string(data), workDir) && (sid <= 0 || sessionOf(pid) != sid) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(data), "\x00"), "\x00")
		out = append(out, fmt.Sprintf("%s (pid %d)", filepath.Base(args[0]), pid))
	}
	sort.Strings(out)
	return out
}

func sessionOf(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after "(comm)": state ppid pgrp session ...
	fields := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
	if len(fields) < 4 {
		return 0
	}
	sid, _ := strconv.Atoi(fields[3])
	return sid
}

func mountsUnder(dir string) []string {
	data, _ := os.ReadFile("/proc/mounts")
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 1 && (f[1] == dir || strings.HasPrefix(f[1], dir+"/")) {
			out = append(out, f[1])
		}
	}
	return out
}

func down() error {
	s, err := readState()
	if err != nil {
		if _, statErr := os.Stat(workDir); errors.Is(statErr, os.ErrNotExist) {
			logf("no demo running (%s does not exist); nothing to do", workDir)
			return nil
		}
		s = &state{}
	}
	before := leftovers(s.Pid)
	if alive(s.Pid) {
		logf("stopping the demo daemon (pid %d) and the %d processes it runs", s.Pid, len(before)-1)
		if err := syscall.Kill(s.Pid, syscall.SIGTERM); err != nil {
			return err
		}
		deadline := time.Now().Add(90 * time.Second)
		for alive(s.Pid) && time.Now().Before(deadline) {
			time.Sleep(200 * time.Millisecond)
		}
		if alive(s.Pid) {
			logf("daemon still running after 90s: killing pid %d", s.Pid)
			_ = syscall.Kill(s.Pid, syscall.SIGKILL)
			time.Sleep(time.Second)
		}
	}
	var problems []string
	if left := leftovers(s.Pid); len(left) > 0 {
		problems = append(problems, "processes still running: "+strings.Join(left, ", "))
	}
	if m := mountsUnder(workDir); len(m) > 0 {
		problems = append(problems, "still mounted: "+strings.Join(m, ", "))
	}
	if _, err := os.Stat(workDir); err == nil {
		if len(problems) == 0 {
			// The daemon died without cleaning up; nothing runs or is mounted there.
			if err := os.RemoveAll(workDir); err != nil {
				problems = append(problems, fmt.Sprintf("remove %s: %v", workDir, err))
			}
		} else {
			problems = append(problems, workDir+" is still there")
		}
	}
	if len(problems) > 0 {
		return errors.New(strings.Join(problems, "; "))
	}
	if len(before) > 0 {
		logf("stopped: %s", strings.Join(before, ", "))
	}
	logf("removed %s (cluster state, certificates, node and plugin state, logs); no process or mount under it is left", workDir)
	if s.Log != "" {
		logf("the daemon's own log stays at %s", s.Log)
	}
	return nil
}
