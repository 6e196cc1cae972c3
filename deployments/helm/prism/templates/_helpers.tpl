{{/* The driver name; fixed, the binaries and DeviceClasses depend on it. */}}
{{- define "prism.driverName" -}}gpu.prism.dev{{- end -}}

{{- define "prism.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* release-chart, or the release name when it already contains the chart name. */}}
{{- define "prism.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "prism.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prism.labels" -}}
helm.sh/chart: {{ include "prism.chart" . }}
app.kubernetes.io/name: {{ include "prism.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prism
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (dict "ctx" $ "component" "controller") */}}
{{- define "prism.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prism.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "prism.componentLabels" -}}
{{ include "prism.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* One of the chart's images: (dict "ctx" $ "name" "prism-controller" "digest" "sha256:...") */}}
{{- define "prism.image" -}}
{{- $repo := printf "%s/%s" (.ctx.Values.image.repository | trimSuffix "/") .name -}}
{{- if .digest -}}
{{- printf "%s@%s" $repo .digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .ctx.Chart.AppVersion .ctx.Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "prism.kubeletPlugin.image" -}}
{{- include "prism.image" (dict "ctx" . "name" "prism-kubelet-plugin" "digest" .Values.image.kubeletPluginDigest) -}}
{{- end -}}

{{- define "prism.controller.image" -}}
{{- include "prism.image" (dict "ctx" . "name" "prism-controller" "digest" .Values.image.controllerDigest) -}}
{{- end -}}

{{- define "prism.kubeletPlugin.fullname" -}}
{{- printf "%s-kubelet-plugin" (include "prism.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prism.controller.fullname" -}}
{{- printf "%s-controller" (include "prism.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prism.webhook.serviceName" -}}
{{- printf "%s-webhook" (include "prism.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prism.webhook.certName" -}}
{{- printf "%s-webhook-cert" (include "prism.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prism.kubeletPlugin.serviceAccountName" -}}
{{- if .Values.kubeletPlugin.serviceAccount.create -}}
{{- default (include "prism.kubeletPlugin.fullname" .) .Values.kubeletPlugin.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.kubeletPlugin.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "prism.controller.serviceAccountName" -}}
{{- if .Values.controller.serviceAccount.create -}}
{{- default (include "prism.controller.fullname" .) .Values.controller.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.controller.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Whether the plugin container runs privileged: the explicit value, else not in simulation. */}}
{{- define "prism.kubeletPlugin.privileged" -}}
{{- if kindIs "bool" .Values.kubeletPlugin.privileged -}}
{{- .Values.kubeletPlugin.privileged -}}
{{- else -}}
{{- empty .Values.simulation.fleet -}}
{{- end -}}
{{- end -}}

{{/* The driver root as the plugin sees it: the host path, or /driver-root for a host-installed driver. */}}
{{- define "prism.kubeletPlugin.containerDriverRoot" -}}
{{- $root := .Values.kubeletPlugin.paths.driverRoot | trimSuffix "/" -}}
{{- if eq $root "" -}}/driver-root{{- else -}}{{ $root }}{{- end -}}
{{- end -}}

{{/* Host path of nvidia-cdi-hook: copied there from the image, named by the CDI specs. */}}
{{- define "prism.kubeletPlugin.cdiHookPath" -}}
{{- printf "%s/bin/nvidia-cdi-hook" (.Values.kubeletPlugin.paths.stateDir | trimSuffix "/") -}}
{{- end -}}

{{/* Host path of the profiling preload shim: copied there from the image, mounted into profiled workloads. */}}
{{- define "prism.kubeletPlugin.profilingShimPath" -}}
{{- printf "%s/shim/libprism-profile.so" (.Values.kubeletPlugin.paths.stateDir | trimSuffix "/") -}}
{{- end -}}

{{/*
The plugin's probe socket on the host network, in the pod's own /tmp
(an emptyDir): two pods of a rolling update never share it.
*/}}
{{- define "prism.kubeletPlugin.probeSocket" -}}
/tmp/prism-probe.sock
{{- end -}}

{{- define "prism.verbosity" -}}
{{- if kindIs "invalid" .local -}}{{ .global }}{{- else -}}{{ .local }}{{- end -}}
{{- end -}}

{{/* A feature-gate map as --feature-gates spells it: A=true,B=false, in
name order. */}}
{{- define "prism.featureGates" -}}
{{- $gates := list -}}
{{- range $name, $on := . -}}
{{- $gates = append $gates (printf "%s=%t" $name $on) -}}
{{- end -}}
{{- join "," $gates -}}
{{- end -}}

{{/* Namespaces excluded from both webhooks. */}}
{{- define "prism.webhook.namespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values:
        {{- range (concat (list .Release.Namespace "kube-system") .Values.webhook.excludeNamespaces | uniq) }}
        - {{ . | quote }}
        {{- end }}
{{- end -}}

{{/*
The path token the controller keeps in the webhooks' paths (self-signed
mode; docs/security.md, "Under the default chart: the path token"), as
"/<token>", read from the installed prism-rewrite so that an upgrade
renders the paths the cluster has and does not reset them. Empty on a
first install, under helm template, or with cert-manager.
*/}}
{{- define "prism.webhook.pathToken" -}}
{{- if not .Values.webhook.certManager.enabled -}}
{{- $token := "" -}}
{{- $installed := lookup "admissionregistration.k8s.io/v1" "MutatingWebhookConfiguration" "" "prism-rewrite" -}}
{{- range (($installed).webhooks | default list) -}}
{{- $path := "" -}}
{{- if (.clientConfig).service -}}
{{- $path = .clientConfig.service.path | default "" -}}
{{- else if (.clientConfig).url -}}
{{- $path = (urlParse .clientConfig.url).path -}}
{{- end -}}
{{- if not $token -}}
{{- $token = regexFind "/[0-9a-f]{32}$" $path -}}
{{- end -}}
{{- end -}}
{{- $token -}}
{{- end -}}
{{- end -}}

{{/* Where the API server sends one webhook's reviews: (dict "ctx" $ "path" "/validate") */}}
{{- define "prism.webhook.clientConfig" -}}
{{- $url := .ctx.Values.webhook.url -}}
{{- $path := printf "%s%s" .path (include "prism.webhook.pathToken" .ctx) -}}
clientConfig:
  {{- if $url.enabled }}
  {{- /* An IPv6 address needs brackets in a URL. */}}
  {{- $host := ternary (printf "[%s]" $url.host) $url.host (contains ":" $url.host) }}
  url: {{ printf "https://%s:%d%s" $host (int .ctx.Values.webhook.port) $path | quote }}
  {{- else }}
  service:
    name: {{ include "prism.webhook.serviceName" .ctx }}
    namespace: {{ .ctx.Release.Namespace }}
    path: {{ $path | quote }}
    port: 443
  {{- end }}
{{- end -}}

{{/*
The kubeconfig Secret of a component (test and air-gap option), as its
KUBECONFIG variable, volume mount or volume: (dict "secret" NAME "part" "env|mount|volume").
Both binaries read KUBECONFIG.
*/}}
{{- define "prism.kubeconfig" -}}
{{- if eq .part "env" -}}
- name: KUBECONFIG
  value: /etc/prism/kubeconfig/kubeconfig
{{- else if eq .part "mount" -}}
- name: kubeconfig
  mountPath: /etc/prism/kubeconfig
  readOnly: true
{{- else if eq .part "volume" -}}
- name: kubeconfig
  secret:
    secretName: {{ .secret }}
    items:
      - key: kubeconfig
        path: kubeconfig
{{- end -}}
{{- end -}}
