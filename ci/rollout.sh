#!/usr/bin/env bash
# The accord rollout gate: run `accord conformance --deploy` inside the pinned image
# that is about to be rolled out, with the production deploy config, and fail the
# rollout when the gate fails. Copy this into your release pipeline.
#
#   ci/rollout.sh IMAGE_TAG DEPLOY_YAML [REPORT_DIR]
#
#   IMAGE_TAG    the exact image to roll out, pinned by digest or immutable tag
#                (registry.example.com/accord@sha256:... is best: a tag can move)
#   DEPLOY_YAML  the production deploy config (what `accord serve` takes + `gate:`)
#   REPORT_DIR   where report.json, junit.xml and report.html go (default: ./gate-reports)
#
# Environment:
#   MODEL_ROOT          host folder mounted read-only at /models (deploy.yaml's model: paths)
#   DEVICE_FLAGS        docker flags that hand the node's accelerators to the container;
#                       default "--gpus all" (NVIDIA). ROCm: "--device /dev/kfd --device /dev/dri
#                       --group-add video"; Ascend: "--device /dev/davinci0 --device
#                       /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc"
#   ACCORD_RUNTIME      "docker" (default) or "local" (already inside the image: run accord directly)
#   GATE_ARGS           extra flags for `accord conformance` (e.g. "--op fused_moe" to bisect)
#
# Exit status: 0 the gate passed; 1 the gate failed (do not roll out); 2 the gate could
# not run (bad config, backend unavailable: do not roll out either).
set -euo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi

image="$1"
deploy="$(realpath "$2")"
reports="$(realpath -m "${3:-gate-reports}")"
model_root="${MODEL_ROOT:-/models}"
runtime="${ACCORD_RUNTIME:-docker}"
read -r -a device_flags <<< "${DEVICE_FLAGS:---gpus all}"
read -r -a gate_args <<< "${GATE_ARGS:-}"

mkdir -p "$reports"
echo "rollout gate: image $image, deploy config $deploy, reports in $reports" >&2

status=0
if [[ "$runtime" == "local" ]]; then
    accord conformance --deploy "$deploy" --report-dir "$reports" "${gate_args[@]}" || status=$?
else
    docker run --rm "${device_flags[@]}" \
        -v "$model_root:/models:ro" \
        -v "$deploy:/gate/deploy.yaml:ro" \
        -v "$reports:/gate/reports" \
        "$image" \
        accord conformance --deploy /gate/deploy.yaml --report-dir /gate/reports "${gate_args[@]}" || status=$?
fi

case "$status" in
    0) echo "rollout gate PASSED: $image may roll out with $(basename "$deploy")" >&2 ;;
    1) echo "rollout gate FAILED: do not roll out $image; see $reports/report.html" >&2 ;;
    *) echo "rollout gate could not run (exit $status): do not roll out $image" >&2 ;;
esac
exit "$status"
