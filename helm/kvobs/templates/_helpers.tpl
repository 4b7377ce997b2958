{{/* Names, labels and the prometheus-operator API check shared by every template. */}}

{{- define "kvobs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource name prefix: <release>-kvobs, or the release name when it has "kvobs". */}}
{{- define "kvobs.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := include "kvobs.name" . }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kvobs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvobs.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "kvobs.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvobs.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvobs
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Labels of the demo pods' Deployment selector (never changes after install). */}}
{{- define "kvobs.demo.selectorLabels" -}}
{{ include "kvobs.selectorLabels" . }}
app.kubernetes.io/component: demo
{{- end }}

{{/* Labels of the fleet aggregator's Deployment selector. */}}
{{- define "kvobs.fleet.selectorLabels" -}}
{{ include "kvobs.selectorLabels" . }}
app.kubernetes.io/component: fleet
{{- end }}

{{- define "kvobs.fleet.fullname" -}}
{{- printf "%s-fleet" (include "kvobs.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvobs.demo.fullname" -}}
{{- printf "%s-demo" (include "kvobs.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kvobs.demo.image" -}}
{{- include "kvobs.image" (dict "image" .Values.demo.image "Chart" .Chart) }}
{{- end }}

{{- define "kvobs.fleet.image" -}}
{{- include "kvobs.image" (dict "image" .Values.fleet.image "Chart" .Chart) }}
{{- end }}

{{/* repository@digest, else repository:tag (the tag defaults to the chart's appVersion). */}}
{{- define "kvobs.image" -}}
{{- $image := .image }}
{{- if $image.digest }}
{{- printf "%s@%s" $image.repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $image.repository (default .Chart.AppVersion $image.tag) }}
{{- end }}
{{- end }}

{{/*
"true" when the prometheus-operator custom resources should render: the cluster serves
monitoring.coreos.com/v1 (helm install discovers it; helm template takes
--api-versions), or prometheusOperator.force is set. Templates test it with eq "true".
*/}}
{{- define "kvobs.prometheusOperatorApi" -}}
{{- if or .Values.prometheusOperator.force (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") }}true{{ else }}false{{ end }}
{{- end }}
