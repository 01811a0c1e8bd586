# shellcheck shell=bash
# Set up (once) and activate the vla-rl environment. Sourced by scripts/quickstart.sh and scripts/test.sh.
#
# - a Python 3.12 virtual environment OUTSIDE the clone, keyed on the dependency
#   spec in pyproject.toml: ${VLA_RL_HOME:-~/.cache/vla-rl}/venv-<hash>, reused when present;
# - the CPU Vulkan driver (Mesa 25 lavapipe) for ManiSkill/SAPIEN when no GPU driver is present;
# - EGL for MuJoCo/LIBERO off-screen rendering;
# - LIBERO's config and assets, offline;
# - runtime variables so nothing is written to the home folder by surprise.
# Errors `return` (never `exit`), so sourcing this from an interactive shell cannot close it; the two
# scripts that source it run with `set -euo pipefail` and stop on the first failure.

VLA_RL_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VLA_RL_HOME="${VLA_RL_HOME:-$HOME/.cache/vla-rl}"
mkdir -p "$VLA_RL_HOME"

_log() { printf '[vla-rl setup] %s\n' "$*" >&2; }

_find_python312() {
  local cand
  for cand in "${VLA_RL_PYTHON:-}" python3.12 "$(command -v pyenv >/dev/null 2>&1 && echo "$(pyenv root)/versions/3.12.1/bin/python3.12")"; do
    [ -n "$cand" ] || continue
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
      command -v "$cand"; return 0
    fi
  done
  if command -v pyenv >/dev/null 2>&1; then
    local v; v="$(pyenv versions --bare 2>/dev/null | grep -E '^3\.12(\.|$)' | tail -n1 || true)"
    if [ -n "$v" ]; then echo "$(pyenv root)/versions/$v/bin/python3.12"; return 0; fi
  fi
  return 1
}

_system_packages() {
  # EGL/GL for MuJoCo and LIBERO rendering, Vulkan loader for SAPIEN. The cache is read once into a variable:
  # `ldconfig -p | grep -q` under the scripts' `set -o pipefail` fails whenever grep exits before ldconfig has
  # written everything (SIGPIPE), which sent a machine with the libraries into apt-get at random.
  local libs; libs="$(ldconfig -p 2>/dev/null || true)"
  if grep -q 'libEGL.so.1' <<<"$libs" && grep -q 'libvulkan.so.1' <<<"$libs" \
     && grep -q 'libOSMesa\|libGL.so.1' <<<"$libs"; then
    return 0
  fi
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    _log "missing EGL/Vulkan system libraries: install libegl1 libgl1 libgles2 libvulkan1 mesa-vulkan-drivers (needs root)"
    return 1
  fi
  _log "installing EGL/GL/Vulkan system libraries (apt-get)"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libegl1 libgl1 libgles2 libglx-mesa0 libegl-mesa0 \
    libgl1-mesa-dri libvulkan1 mesa-vulkan-drivers >/dev/null
}

_dep_hash() {
  # Only the dependency spec (and this script's install steps) decide whether the venv is reused.
  python3 - "$VLA_RL_ROOT/pyproject.toml" <<'PY'
import hashlib, json, sys, tomllib
p = tomllib.load(open(sys.argv[1], "rb"))["project"]
spec = {"requires-python": p.get("requires-python"), "dependencies": p.get("dependencies"),
        "optional": p.get("optional-dependencies"), "install-recipe": 1}
print(hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12])
PY
}

_system_packages || return 1

VLA_RL_VENV="${VLA_RL_VENV:-$VLA_RL_HOME/venv-$(_dep_hash)}"
export VLA_RL_VENV
if [ ! -f "$VLA_RL_VENV/.vla-rl-complete" ]; then
  PY312="$(_find_python312)" || {
    _log "Python 3.12 is required (LeRobot 0.6 needs >= 3.12): install it (e.g. 'pyenv install 3.12' or your distribution's python3.12) or set VLA_RL_PYTHON"
    return 1
  }
  _log "creating the Python 3.12 environment at $VLA_RL_VENV (one time, ~10 min, ~8 GB)"
  rm -rf "$VLA_RL_VENV"
  "$PY312" -m venv "$VLA_RL_VENV" || return 1
  "$VLA_RL_VENV/bin/pip" install -q --upgrade pip || return 1
  # The pinned dependency set of pyproject.toml and the project itself (editable); progress lines only,
  # the full log in $VLA_RL_HOME/install.log.
  if ! { "$VLA_RL_VENV/bin/pip" install --progress-bar off -e "$VLA_RL_ROOT[ros,dev,ray,mpi]" 2>&1 \
         | tee "$VLA_RL_HOME/install.log" | grep --line-buffered -E '^(Collecting|Successfully installed)' \
         | cut -c1-100 >&2; [ "${PIPESTATUS[0]}" -eq 0 ]; }; then
    _log "pip install failed; full log: $VLA_RL_HOME/install.log"
    return 1
  fi
  "$VLA_RL_VENV/bin/pip" check >&2 || _log "warning: pip check reported conflicts (see above)"
  touch "$VLA_RL_VENV/.vla-rl-complete"
else
  # Point the editable install at this clone (fast: dependencies are already there).
  "$VLA_RL_VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$VLA_RL_ROOT" >/dev/null 2>&1 \
    || "$VLA_RL_VENV/bin/pip" install -q --no-deps -e "$VLA_RL_ROOT" >&2
fi
_log "Python environment: $VLA_RL_VENV"

# Vulkan for SAPIEN (ManiSkill): a GPU driver when present, else Mesa 25 lavapipe.
if ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  if [ -z "${VK_ICD_FILENAMES:-}" ]; then
    VK_ICD_FILENAMES="$(bash "$VLA_RL_ROOT/scripts/install_lavapipe.sh" "$VLA_RL_HOME/lavapipe" | tail -n1)" \
      || { _log "could not install the lavapipe Vulkan driver; ManiSkill envs will not start"; VK_ICD_FILENAMES=""; }
    export VK_ICD_FILENAMES
  fi
fi

# LIBERO: config and assets offline.
if [ -z "${LIBERO_CONFIG_PATH:-}" ]; then
  LIBERO_CONFIG_PATH="$("$VLA_RL_VENV/bin/python" "$VLA_RL_ROOT/scripts/libero_config.py" "$VLA_RL_HOME/libero" | tail -n1 | sed 's/^export LIBERO_CONFIG_PATH=//')" \
    || { _log "could not write the LIBERO config; LIBERO envs will not start"; LIBERO_CONFIG_PATH=""; }
  export LIBERO_CONFIG_PATH
fi

export PATH="$VLA_RL_VENV/bin:$PATH"
# This clone's packages come first on the path, whichever clone the shared venv's editable install points at:
# two checkouts used at the same time (a branch and main, a test run beside a training run) each run their own code.
export PYTHONPATH="$VLA_RL_ROOT${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export LP_NUM_THREADS="${LP_NUM_THREADS:-1}"
export MUJOCO_GL="${MUJOCO_GL:-egl}"
export PYOPENGL_PLATFORM="${PYOPENGL_PLATFORM:-egl}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export HF_LEROBOT_HOME="${HF_LEROBOT_HOME:-$VLA_RL_HOME/lerobot}"
export ROS_AUTOMATIC_DISCOVERY_RANGE="${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}"
export ROS_LOG_DIR="${ROS_LOG_DIR:-$VLA_RL_HOME/ros-log}"
export MESA_SHADER_CACHE_DIR="${MESA_SHADER_CACHE_DIR:-$VLA_RL_HOME/mesa-cache}"
export WANDB_CACHE_DIR="${WANDB_CACHE_DIR:-$VLA_RL_HOME/wandb-cache}"
export WANDB_CONFIG_DIR="${WANDB_CONFIG_DIR:-$VLA_RL_HOME/wandb-config}"
if [ -z "${WANDB_API_KEY:-}" ]; then export WANDB_MODE="${WANDB_MODE:-offline}"; fi
export MS_ASSET_DIR="${MS_ASSET_DIR:-$VLA_RL_HOME/maniskill}"
