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

{{/* "true" when the Xid watcher runs. Its default source is NVML events (config.xidNvmlEvents,
     on unless false); the kernel log only with xid.kmsg.enabled. "validate" refuses xid.enabled
     with neither source. */}}
{{- define "kube-gpu-exporter.xid" -}}
{{- if and .Values.xid.enabled (or .Values.xid.kmsg.enabled (ne (toString .Values.config.xidNvmlEvents) "false")) -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the exporter reads the host's /dev/kmsg. */}}
{{- define "kube-gpu-exporter.kmsg" -}}
{{- if and (include "kube-gpu-exporter.xid" .) .Values.xid.kmsg.enabled -}}
true
{{- end -}}
{{- end -}}

{{/* "true" when the exporter writes Xid Events: it has an API client only with the pod watch. */}}
{{- define "kube-gpu-exporter.events" -}}
{{- if and (include "kube-gpu-exporter.xid" .) .Values.xid.events (include "kube-gpu-exporter.podWatch" .) -}}
true
{{- end -}}
{{- end -}}

{{/* The namespace of the Xid Events about the Node (xid.eventsNamespace, the exporter's
     --xid-events-namespace); tests/test_helm_rbac.py checks it against the Events the code writes. */}}
{{- define "kube-gpu-exporter.eventsNamespace" -}}
{{- .Values.xid.eventsNamespace | default "default" -}}
{{- end -}}

{{/* "true" when Xids of known pods become Events about the Pod, in the pods' namespaces
     (xid.eventsRegarding pod): the events grant is then cluster-wide. */}}
{{- define "kube-gpu-exporter.eventsAboutPods" -}}
{{- if eq (.Values.xid.eventsRegarding | default "node") "pod" -}}
true
{{- end -}}
{{- end -}}

{{/* The label selectors of the nodes the DaemonSet may run on, one per required nodeSelectorTerm (the
     scheduler ORs the terms), each with nodeSelector's pairs: kubectl's -l syntax, space-separated,
     each quoted for a shell. NOTES.txt counts the nodes they select. */}}
{{- define "kube-gpu-exporter.nodeSelectorsForKubectl" -}}
{{- $base := list }}
{{- range $k, $v := .Values.nodeSelector }}{{ $base = append $base (printf "%s=%s" $k $v) }}{{ end }}
{{- $out := list }}
{{- $terms := list }}
{{- with .Values.affinity }}{{ with .nodeAffinity }}{{ with .requiredDuringSchedulingIgnoredDuringExecution }}
{{- $terms = .nodeSelectorTerms }}
{{- end }}{{ end }}{{ end }}
{{- range $terms }}
{{- $parts := $base }}
{{- range .matchExpressions }}
{{- $op := .operator }}
{{- if and (eq $op "In") (eq (len .values) 1) }}{{ $parts = append $parts (printf "%s=%s" .key (first .values)) }}
{{- else if eq $op "In" }}{{ $parts = append $parts (printf "%s in (%s)" .key (join "," .values)) }}
{{- else if eq $op "NotIn" }}{{ $parts = append $parts (printf "%s notin (%s)" .key (join "," .values)) }}
{{- else if eq $op "Exists" }}{{ $parts = append $parts .key }}
{{- else if eq $op "DoesNotExist" }}{{ $parts = append $parts (printf "!%s" .key) }}
{{- else if eq $op "Gt" }}{{ $parts = append $parts (printf "%s>%s" .key (first .values)) }}
{{- else if eq $op "Lt" }}{{ $parts = append $parts (printf "%s<%s" .key (first .values)) }}
{{- end }}
{{- end }}
{{- $out = append $out (printf "'%s'" (join "," $parts)) }}
{{- end }}
{{- if not $terms }}{{ $out = append $out (printf "'%s'" (join "," $base)) }}{{ end }}
{{- join " " $out }}
{{- end -}}

{{/* config.dcgmCompat under honorLabels false: the target labels namespace/pod/container (the
     exporter's own pod) win over the DCGM_FI_* series' own, which Prometheus renames exported_*.
     These metric relabelings, on DCGM_FI_* series only, put the series' own values back and drop
     the exported_* copies; a series without them (a shared or unheld GPU, a MIG card's own) ends
     with no namespace/pod/container at all, never the exporter's. docs/deploy.md#dcgm-workload-labels;
     tests/test_helm_dcgm_labels.py runs them in a real Prometheus. */}}
{{- define "kube-gpu-exporter.dcgmMetricRelabelings" -}}
{{- range list "namespace" "pod" "container" }}
- sourceLabels: [__name__, exported_{{ . }}]
  regex: "DCGM_FI_.+;(.*)"
  targetLabel: {{ . }}
  replacement: "${1}"
  action: replace
{{- end }}
{{- range list "namespace" "pod" "container" }}
- sourceLabels: [__name__]
  regex: "DCGM_FI_.+"
  targetLabel: exported_{{ . }}
  replacement: ""
  action: replace
{{- end }}
{{- end -}}

{{/* "true" when the container runs as uid 0: the kubelet's pod-resources socket is writable only
     by root, and CAP_SYSLOG (kernel.dmesg_restrict=1) is effective only for uid 0. */}}
{{- define "kube-gpu-exporter.runAsRoot" -}}
{{- if or .Values.podResources.enabled (and (include "kube-gpu-exporter.kmsg" .) .Values.xid.kmsg.runAsRoot) -}}
true
{{- end -}}
{{- end -}}

{{/* Container securityContext: the values' one (non-root, unprivileged, no capabilities), plus
     exactly what the opt-ins need (docs/deploy.md#security-context). */}}
{{- define "kube-gpu-exporter.securityContext" -}}
{{- $sc := deepCopy .Values.securityContext -}}
{{- if include "kube-gpu-exporter.runAsRoot" . -}}
{{- $_ := set $sc "runAsUser" 0 -}}
{{- $_ := set $sc "runAsNonRoot" false -}}
{{- end -}}
{{- if include "kube-gpu-exporter.kmsg" . -}}
{{- if .Values.xid.kmsg.privileged -}}
{{- /* privileged grants every capability and the host's devices; a drop list or
       allowPrivilegeEscalation=false would contradict it (the API rejects the latter). */ -}}
{{- $_ := set $sc "privileged" true -}}
{{- $_ := unset $sc "allowPrivilegeEscalation" -}}
{{- $_ := unset $sc "capabilities" -}}
{{- else if .Values.xid.kmsg.runAsRoot -}}
{{- $caps := deepCopy (default dict $sc.capabilities) -}}
{{- $_ := set $caps "add" (append (default list $caps.add) "SYSLOG" | uniq) -}}
{{- $_ := set $sc "capabilities" $caps -}}
{{- end -}}
{{- end -}}
{{- toYaml $sc -}}
{{- end -}}

{{/* Checks that stop a rendering with a clear message: the removed xid.privileged/kmsgHostPath
     (which would otherwise be ignored silently), an Xid watcher without a source, and renamed
     labels. The bundled recording rules, alerts and dashboards were generated for the exporter's
     default label names: each one that is rendered refuses other names (a renamed label would
     leave its queries silently empty). */}}
{{- define "kube-gpu-exporter.validate" -}}
{{- if and (include "kube-gpu-exporter.eventsAboutPods" .) (include "kube-gpu-exporter.events" .) (not (include "kube-gpu-exporter.kmsg" .)) -}}
{{- fail "xid.eventsRegarding=pod needs xid.kmsg.enabled=true: only the kernel log names the process (hence the pod) of an Xid; NVML events do not (docs/xid.md#where-the-events-go)." -}}
{{- end -}}
{{- range $key := list "privileged" "kmsgHostPath" -}}
{{- if hasKey $.Values.xid $key -}}
{{- fail (printf "xid.%s was replaced by xid.kmsg (enabled, hostPath, privileged, runAsRoot): the kernel log is now an opt-in, Xids come from NVML events by default (docs/deploy.md#security-context)." $key) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.xid.enabled (not .Values.xid.kmsg.enabled) (eq (toString .Values.config.xidNvmlEvents) "false") -}}
{{- fail "xid.enabled with config.xidNvmlEvents=false and xid.kmsg.enabled=false leaves the Xid watcher no source: set xid.kmsg.enabled=true, leave config.xidNvmlEvents unset, or set xid.enabled=false." -}}
{{- end -}}
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

{{/* kube-prometheus-stack: release: <prometheusStack.release>, the label its Prometheus selects
     ServiceMonitors and PrometheusRules by (default serviceMonitorSelector/ruleSelector). A YAML
     map, empty without the value. */}}
{{- define "kube-gpu-exporter.stackLabels" -}}
{{- with (.Values.prometheusStack | default dict).release -}}
release: {{ . | quote }}
{{- end -}}
{{- end -}}

{{/* The extra metadata labels of each monitoring object, as a YAML map: its own labels win over
     the kube-prometheus-stack release label. The templates and NOTES.txt read the same maps. */}}
{{- define "kube-gpu-exporter.serviceMonitorLabels" -}}
{{- merge (deepCopy (.Values.serviceMonitor.labels | default dict)) (include "kube-gpu-exporter.stackLabels" . | fromYaml) | toYaml -}}
{{- end -}}

{{- define "kube-gpu-exporter.prometheusRuleLabels" -}}
{{- merge (deepCopy (.Values.prometheusRule.labels | default dict)) (include "kube-gpu-exporter.stackLabels" . | fromYaml) | toYaml -}}
{{- end -}}

{{/* alerts.labels, then prometheusRule.labels (both objects are read by the same ruleSelector),
     then the release label. */}}
{{- define "kube-gpu-exporter.alertsLabels" -}}
{{- merge (deepCopy (.Values.alerts.labels | default dict)) (deepCopy (.Values.prometheusRule.labels | default dict)) (include "kube-gpu-exporter.stackLabels" . | fromYaml) | toYaml -}}
{{- end -}}

{{/* The sidecar's label wins over dashboards.labels, which win over the release label. */}}
{{- define "kube-gpu-exporter.dashboardLabels" -}}
{{- $d := .Values.dashboards -}}
{{- merge (dict $d.label (toString $d.labelValue)) (deepCopy ($d.labels | default dict)) (include "kube-gpu-exporter.stackLabels" . | fromYaml) | toYaml -}}
{{- end -}}
