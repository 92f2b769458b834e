{{/* Chart name, truncated to 63 characters (DNS label). */}}
{{- define "kube-gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Release full name; the release name alone when it already contains the chart name. */}}
{{- define "kube-gpu-exporter.fullname" -}}
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

{{- define "kube-gpu-exporter.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kube-gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kube-gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kube-gpu-exporter.labels" -}}
helm.sh/chart: {{ include "kube-gpu-exporter.chart" . }}
{{ include "kube-gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: exporter
{{- end -}}

{{- define "kube-gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kube-gpu-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kube-gpu-exporter.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the Prometheus Operator API is served (or assumed to be). */}}
{{- define "kube-gpu-exporter.monitoringAPI" -}}
{{- if or (.Capabilities.APIVersions.Has "monitoring.coreos.com/v1") .Values.monitoring.assumeCRDsPresent -}}
true
{{- end -}}
{{- end -}}

{{/* Pod watch on unless config.podWatch is false. */}}
{{- define "kube-gpu-exporter.podWatch" -}}
{{- if not (eq (toString .Values.config.podWatch) "false") -}}
true
{{- end -}}
{{- end -}}

{{- define "kube-gpu-exporter.events" -}}
{{- if and .Values.xid.enabled .Values.xid.events -}}
true
{{- end -}}
{{- end -}}

{{/* Container securityContext: the values' one, plus what the Xid watcher needs. */}}
{{- define "kube-gpu-exporter.securityContext" -}}
{{- $sc := deepCopy .Values.securityContext -}}
{{- if .Values.xid.enabled -}}
{{- if .Values.xid.privileged -}}
{{- /* privileged grants every capability and the host's devices; a drop list or
       allowPrivilegeEscalation=false would contradict it (the API rejects the latter). */ -}}
{{- $_ := set $sc "privileged" true -}}
{{- $_ := unset $sc "allowPrivilegeEscalation" -}}
{{- $_ := unset $sc "capabilities" -}}
{{- else -}}
{{- $caps := deepCopy (default dict $sc.capabilities) -}}
{{- $_ := set $caps "add" (append (default list $caps.add) "SYSLOG" | uniq) -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Checks that stop a rendering with a clear message. The bundled recording rules, alerts and
     dashboards were generated for the exporter's default label names: each one that is rendered
     refuses other names (a renamed label would leave its queries silently empty). */}}
{{- define "kube-gpu-exporter.validate" -}}
{{- $defaults := dict "podLabel" "pod_name" "namespaceLabel" "namespace_name" "containerLabel" "container_name" -}}
{{- $monitoring := include "kube-gpu-exporter.monitoringAPI" . -}}
{{- $bundles := list -}}
{{- if and .Values.prometheusRule.enabled $monitoring -}}
{{- $bundles = append $bundles (list "recording rules" "prometheusRule.enabled=false" "kube-gpu-exporter rules" "docs/rules.md") -}}
{{- end -}}
{{- if and .Values.alerts.enabled $monitoring -}}
{{- $bundles = append $bundles (list "alerts" "alerts.enabled=false" "kube-gpu-exporter alerts" "docs/alerts.md") -}}
{{- end -}}
{{- if .Values.dashboards.enabled -}}
{{- $bundles = append $bundles (list "dashboards" "dashboards.enabled=false" "kube-gpu-exporter dashboards --format configmap" "docs/dashboards.md") -}}
{{- end -}}
{{- range $bundle := $bundles -}}
{{- range $key, $default := $defaults -}}
{{- $value := index $.Values.config $key -}}
{{- if and $value (ne (toString $value) $default) -}}
{{- fail (printf "config.%s=%s: the bundled %s use %s. Set %s and load `%s` rendered with the same label names (%s)." $key (toString $value) (index $bundle 0) $default (index $bundle 1) (index $bundle 2) (index $bundle 3)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The matchers the alerts select the exporter's `up` series with: alerts.exporterSelector, or
     the job the ServiceMonitor gives the targets (jobLabel app.kubernetes.io/name). */}}
{{- define "kube-gpu-exporter.exporterSelector" -}}
{{- default (printf "job=%s" (include "kube-gpu-exporter.name" . | quote)) .Values.alerts.exporterSelector -}}
{{- end -}}
