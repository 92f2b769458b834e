{{/* --web-config-file (webConfig): TLS and basic authentication. docs/deploy.md#tls-and-authentication */}}

{{/* "true" when the exporter serves HTTPS, "" otherwise. */}}
{{- define "kube-gpu-exporter.https" -}}
{{- if and .Values.webConfig.secretName .Values.webConfig.tls }}true{{ end -}}
{{- end -}}

{{/* A probe's handler; dict "root" . "path" "/healthz". */}}
{{- define "kube-gpu-exporter.probeHandler" -}}
{{- $w := .root.Values.webConfig -}}
{{- if and $w.secretName (eq $w.probe "tcpSocket") -}}
tcpSocket:
  port: metrics
{{- else -}}
httpGet:
  path: {{ .path }}
  port: metrics
  {{- if include "kube-gpu-exporter.https" .root }}
  scheme: HTTPS
  {{- end }}
  {{- if and $w.secretName $w.probeHttpHeaders }}
  httpHeaders:
    {{- toYaml $w.probeHttpHeaders | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}
