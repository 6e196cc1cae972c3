//go:build tools

// Package tools pins containerd (the daemon, its runc shim and ctr) for the test bed's real
// container runtime. hack/testbed-bins.sh builds it.
package tools

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
