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

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/pflag"

	"github.com/prismgpu/prism/internal/localserve"
)

// probeCommand is the first argument that makes the binary an exec probe
// instead of the plugin: `prism-kubelet-plugin probe readyz`.
const probeCommand = "probe"

// probeEndpoints are what the probe may ask for.
var probeEndpoints = map[string]bool{"healthz": true, "readyz": true}

// probeMain asks the running plugin's probe socket for one endpoint and
// returns the exit status the kubelet reads: 0 healthy or ready, 1 not (the
// reason on stderr, which the kubelet puts in the pod's events), 2 for a
// wrong command line. The socket defaults to PRISM_PROBE_SOCKET, which an
// exec probe inherits from the container.
func probeMain(args []string, stderr io.Writer, lookup func(string) (string, bool)) int {
	flags := pflag.NewFlagSet("prism-kubelet-plugin probe", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	socket, _ := lookup("PRISM_PROBE_SOCKET")
	flags.StringVar(&socket, "socket", socket, "The plugin's --probe-socket; defaults to PRISM_PROBE_SOCKET.")
	timeout := flags.Duration("timeout", 4*time.Second, "How long to wait for the answer; keep it under the probe's timeoutSeconds.")
	flags.Usage = func() {
		_, _ = fmt.Fprintf(stderr, "Usage: prism-kubelet-plugin probe [--socket PATH] [--timeout D] healthz|readyz\n%s", flags.FlagUsages())
	}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		_, _ = fmt.Fprintf(stderr, "prism-kubelet-plugin probe: %v\n", err)
		return 2
	}
	if flags.NArg() != 1 || !probeEndpoints[flags.Arg(0)] {
		_, _ = fmt.Fprintf(stderr, "prism-kubelet-plugin probe: want one of healthz, readyz; got %q\n", flags.Args())
		return 2
	}
	if socket == "" {
		_, _ = fmt.Fprintln(stderr, "prism-kubelet-plugin probe: no socket: pass --socket or set PRISM_PROBE_SOCKET, as the plugin's --probe-socket")
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := localserve.Get(ctx, socket, "/"+flags.Arg(0)); err != nil {
		_, _ = fmt.Fprintf(stderr, "prism-kubelet-plugin probe: %v\n", err)
		return 1
	}
	return 0
}
