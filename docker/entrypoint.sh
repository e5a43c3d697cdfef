#!/bin/sh
# Entry point of trtspec's images (GPU and CPU): prepare | build | wait | serve | all | leader | worker.
#   prepare (the Job, no GPU) download hub checkpoints (HUB_ID=/DIR args), then build if no GPU is needed
#   build   wait for those downloads, then trtspec build + package into the workspace volume (resumable;
#           a no-op when up to date; waits its turn if another pod builds the same engines)
#   wait    wait for the downloads and the Job's repository (a server's init container)
#   serve   wait for the packaged repository, then run tritonserver on it
#   all     build, then serve (the CPU image's default: one container does everything)
#   leader  multi-node: wait for the group's pods, start every rank over kubessh, serve from rank 0
#   worker  multi-node: host the ranks the leader starts; wait for SIGTERM
# The logic lives in trtspec/deploy/launch.py, where it is tested.
set -eu
TRTSPEC_CONFIG="${TRTSPEC_CONFIG:-/etc/trtspec/trtspec.yaml}"
export TRTSPEC_CONFIG
# all interfaces inside the container (trtspec serve alone binds loopback); the launcher passes it on
TRTSPEC_SERVE_HOST="${TRTSPEC_SERVE_HOST:-0.0.0.0}"
export TRTSPEC_SERVE_HOST
exec "${TRTSPEC_PYTHON:-python3}" -m trtspec.deploy.launch "$@"
