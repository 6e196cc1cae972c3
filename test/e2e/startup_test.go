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

package e2e

import (
	"context"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prismgpu/prism/demo/bed"
	"github.com/prismgpu/prism/test/testbed"
)

// TestPluginStartsWithoutTheAPIServer: a node that boots while the API
// server is down (or unreachable from it) gets a plugin that answers its
// liveness probe, stays unready, says in its log what it waits for, without
// a line per retry, and becomes ready and publishes once the API server
// answers.
func TestPluginStartsWithoutTheAPIServer(t *testing.T) {
	ctx, cluster, node := localNode(t)
	createPrismDeviceClass(ctx, t, cluster)
	apiServer, err := url.Parse(cluster.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := testbed.StartProxy(apiServer.Host, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	if _, _, err := bed.InstallIdentities(ctx, cluster, repoRoot); err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := bed.PluginKubeconfig(ctx, cluster, node.Name)
	if err != nil {
		t.Fatal(err)
	}
	proxied := throughProxy(t, kubeconfig, proxy.Addr)

	p := newPluginProc(ctx, t, cluster, node, fleetPath("mixed.yaml"), []string{"--kubeconfig=" + proxied})
	started := time.Now()
	p.start(ctx, t)

	// Alive: the kubelet must not restart it for waiting.
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return probe(p.HTTPAddr, "/healthz") == http.StatusOK, nil
	})
	if err != nil {
		t.Fatalf("/healthz never answered 200 while the API server was unreachable: %v (log %s)", err, p.LogPath)
	}
	// Says why it is not ready; the first report comes after 10 s.
	const waiting = "Not ready: the API server cannot be reached"
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return strings.Contains(readFile(t, p.LogPath), waiting), nil
	})
	if err != nil {
		t.Fatalf("the log never said %q (log %s)", waiting, p.LogPath)
	}
	if code := probe(p.HTTPAddr, "/readyz"); code == http.StatusOK {
		t.Fatalf("/readyz answered 200 while the API server was unreachable")
	}
	if exited, err := p.Exited(); exited {
		t.Fatalf("plugin exited while the API server was unreachable: %v (log %s)", err, p.LogPath)
	}

	proxy.SetOpen(true)
	p.waitReady(t)
	waitForSlice(ctx, t, cluster.Client, node.Name, 8)

	// One line at 10 s, then one every 30 s: not a line per retry.
	lines := strings.Count(readFile(t, p.LogPath), waiting)
	if most := 1 + int(time.Since(started)/(30*time.Second)) + 1; lines > most {
		t.Errorf("%d %q lines in %s, want at most %d", lines, waiting, time.Since(started).Round(time.Second), most)
	}
}

// throughProxy writes a copy of a kubeconfig whose clusters are reached at
// addr, and returns its path. The API server's certificate names
// 127.0.0.1, which the proxy listens on too.
func throughProxy(t *testing.T, kubeconfig, addr string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	out := filepath.Join(t.TempDir(), "proxied.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func probe(addr, path string) int {
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
