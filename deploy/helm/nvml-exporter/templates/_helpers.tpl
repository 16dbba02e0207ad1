{{/*
Names and labels shared by the templates.
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "nvml-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The objects' name: fullnameOverride, else the release name when it holds the chart's name (so
`helm install nvml-exporter` names everything as deploy/kubernetes does), else release-chart.
*/}}
{{- define "nvml-exporter.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "nvml-exporter.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The labels that select the pods; never changed after install (a selector is immutable). */}}
{{- define "nvml-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "nvml-exporter.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end }}

{{/* Every object's labels. */}}
{{- define "nvml-exporter.labels" -}}
{{ include "nvml-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" | quote }}
{{- end }}

{{- define "nvml-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "nvml-exporter.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "nvml-exporter.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* Whether the pod reads the kubelet's /pods: --processes, --kubelet-pods, or pod labels or
annotations to copy, which are read from there. */}}
{{- define "nvml-exporter.kubeletPods" -}}
{{- if or .Values.processes.enabled .Values.kubeletPods.enabled .Values.config.kubernetes_pod_labels .Values.config.kubernetes_pod_annotations }}true{{ end }}
{{- end }}

{{/* Whether the pod calls the API server or the kubelet's API, and so needs its token. */}}
{{- define "nvml-exporter.needsToken" -}}
{{- if or (include "nvml-exporter.kubeletPods" .) .Values.dra.enabled .Values.nodeCondition.enabled }}true{{ end }}
{{- end }}

{{/* Whether a web-config file is given (an existing Secret, or one the chart makes). */}}
{{- define "nvml-exporter.webConfig" -}}
{{- if or .Values.webConfig.existingSecret .Values.webConfig.basicAuthUsers .Values.webConfig.tls.enabled }}true{{ end }}
{{- end }}

{{/*
The configuration file: config with the collectors as its `collector` table. The keys of
restartKeys are the options the exporter applies only at start (its --help lists them;
scripts/gen-helm.py writes the list from there).
*/}}
{{- define "nvml-exporter.config" -}}
{{- $config := deepCopy .Values.config }}
{{- /* Helm reads every number of the values as a float, and toToml would write 16 as 16.0,
which the exporter refuses for an integer option; a whole number is written as one (a float
option takes it too). */}}
{{- range $key, $value := $config }}
{{- if and (kindIs "float64" $value) (eq $value (floor $value)) }}
{{- $_ := set $config $key (int64 $value) }}
{{- end }}
{{- end }}
{{- if .Values.collectors }}
{{- $_ := set $config "collector" .Values.collectors }}
{{- end }}
{{- toToml $config }}
{{- end }}

{{- define "nvml-exporter.restartKeys" -}}
listen nvml_lib demo interval device_timeout stale_grace health_state_file log_format log_level
{{- end }}
