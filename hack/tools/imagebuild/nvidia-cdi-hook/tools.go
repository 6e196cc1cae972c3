//go:build tools

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

// Package tools pins nvidia-cdi-hook, which the kubelet plugin image carries
// and the chart's install-cdi-hook init container copies to the host. Its
// version must equal the nvidia-container-toolkit that the main module's nvcdi
// comes from: the CDI specs nvcdi writes name the hook's subcommands.
// A separate module keeps the hook's dependencies (runc, ...) out of the main
// go.mod. hack/tools/imagebuild builds it.
package tools

import _ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-cdi-hook"
