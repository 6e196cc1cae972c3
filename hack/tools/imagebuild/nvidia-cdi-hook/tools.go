//go:build tools

// Package tools pins nvidia-cdi-hook, which the kubelet plugin image carries
// and the chart's install-cdi-hook init container copies to the host. Its
// version must equal the nvidia-container-toolkit that the main module's nvcdi
// comes from: the CDI specs nvcdi writes name the hook's subcommands.
// A separate module keeps the hook's dependencies (runc, ...) out of the main
// go.mod. hack/tools/imagebuild builds it.
package tools

import _ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
