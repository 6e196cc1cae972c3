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

// Package toolmain starts the commands that run on the local test bed
// (prism-bench, prism-soak) the same way: klog's flags beside their own,
// and a context that SIGINT or SIGTERM cancels.
package toolmain

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// Start parses the command line, with klog's flags added to those the
// command defined on flag.CommandLine, and returns the command's context,
// which carries klog's logger; stop releases the signal handler.
func Start() (ctx context.Context, stop context.CancelFunc) {
	klog.InitFlags(nil)
	_ = flag.Set("v", "0")
	flag.Parse()
	// envtest logs through controller-runtime.
	ctrllog.SetLogger(klog.NewKlogr())
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return klog.NewContext(ctx, klog.Background()), stop
}
