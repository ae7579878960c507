{{/* The driver's socket directory on the node, named after the driver. */}}
{{- define "hostpath-csi.socketDir" -}}
/var/lib/kubelet/plugins/{{ .Values.driverName }}
{{- end -}}

{{/* Every pool path must lie under poolsHostDir, the one host directory mounted for them. */}}
{{- define "hostpath-csi.checkPools" -}}
{{- range .Values.pools -}}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $.Values.poolsHostDir)) .path) -}}
{{- fail (printf "pool %s: path %s is not under poolsHostDir %s" .name .path $.Values.poolsHostDir) -}}
{{- end -}}
{{- end -}}
{{- end -}}
