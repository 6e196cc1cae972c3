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

// Package kubeconfig holds the connection flags every prismctl command takes.
package kubeconfig

import (
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Flags select the cluster: a kubeconfig file and a context in it.
type Flags struct {
	Kubeconfig string
	Context    string
}

// AddTo registers --kubeconfig and --context.
func (f *Flags) AddTo(fs *pflag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "Path to the kubeconfig file (default: $KUBECONFIG or ~/.kube/config).")
	fs.StringVar(&f.Context, "context", "", "Kubeconfig context to use.")
}

// Load returns the REST config and the kubeconfig's namespace, the default
// for commands run without --namespace.
func (f *Flags) Load() (*rest.Config, string, error) {
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
		&clientcmd.ClientConfigLoadingRules{ExplicitPath: f.Kubeconfig, Precedence: clientcmd.NewDefaultClientConfigLoadingRules().Precedence},
		&clientcmd.ConfigOverrides{CurrentContext: f.Context})
	cfg, err := cc.ClientConfig()
	if err != nil {
		return nil, "", fmt.Errorf("loading kubeconfig: %w", err)
	}
	ns, _, err := cc.Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("reading the kubeconfig's namespace: %w", err)
	}
	return cfg, ns, nil
}

// ClientFunc returns an API client and the kubeconfig's namespace, the
// default for commands run without --namespace.
type ClientFunc[C any] = func() (C, string, error)

// Command builds a command around a ClientFunc that makes the client with
// build, from the cluster the connection flags select. The flags are the
// command's own persistent flags, so it can be added to any root command.
func Command[C any](build func(*rest.Config) (C, error), newCommand func(ClientFunc[C]) *cobra.Command) *cobra.Command {
	var conn Flags
	cmd := newCommand(func() (C, string, error) {
		var none C
		cfg, ns, err := conn.Load()
		if err != nil {
			return none, "", err
		}
		c, err := build(cfg)
		if err != nil {
			return none, "", fmt.Errorf("creating API client: %w", err)
		}
		return c, ns, nil
	})
	conn.AddTo(cmd.PersistentFlags())
	return cmd
}

// Clientset is a Command's build for a typed clientset.
func Clientset(cfg *rest.Config) (kubernetes.Interface, error) {
	return kubernetes.NewForConfig(cfg)
}
