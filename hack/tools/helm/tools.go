//go:build tools

// Package tools pins the helm CLI that hack/helm-check.sh and the e2e tests use
// to lint and render deployments/helm/prism. hack/testbed-bins.sh builds it.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
