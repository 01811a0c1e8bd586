#!/usr/bin/env bash
# Install Mesa's lavapipe (a CPU Vulkan driver) for SAPIEN / ManiSkill3 on a
# machine without an NVIDIA driver, plus the EGL/GL libraries that MuJoCo's
# MUJOCO_GL=egl rendering needs.
#
# Usage: scripts/install_lavapipe.sh [TARGET_DIR]
#   TARGET_DIR defaults to ${VLA_RL_HOME:-$HOME/.cache/vla-rl}/lavapipe.
#   The last line on stdout is the ICD json path; use it as
#       export VK_ICD_FILENAMES="$(scripts/install_lavapipe.sh | tail -n1)"
#
# Why: Debian 12's own lavapipe (Mesa 22.3) is rejected by SAPIEN ("Failed to
# find a supported physical device"); Mesa 25 from bookworm-backports works.
# The newer driver is downloaded with a private apt configuration (the
# machine's apt sources stay untouched), unpacked with `dpkg -x` into
# TARGET_DIR and announced through an ICD json written next to it.
#
# Idempotent: does nothing when TARGET_DIR/lvp_icd.json and the driver it
# names already exist. Needs root (or sudo) for the system packages of step 1
# and network access to the Debian mirror. Exits non-zero with a one-line
# message on stderr when it cannot finish.
set -euo pipefail

die() { echo "install_lavapipe.sh: error: $*" >&2; exit 1; }
log() { echo "install_lavapipe.sh: $*" >&2; }

TARGET="${1:-${VLA_RL_HOME:-$HOME/.cache/vla-rl}/lavapipe}"
ICD_JSON="$TARGET/lvp_icd.json"
FALLBACK_API_VERSION="1.4.305"

# The library path recorded in an existing ICD json, if any.
icd_library() {
    sed -n 's/.*"library_path"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$1" | head -n1
}

if [[ -f "$ICD_JSON" ]]; then
    lib="$(icd_library "$ICD_JSON")"
    if [[ -n "$lib" && -f "$lib" ]]; then
        log "already installed ($lib)"
        echo "$ICD_JSON"
        exit 0
    fi
fi

if [[ -e /proc/driver/nvidia/version ]] || command -v nvidia-smi >/dev/null 2>&1; then
    die "an NVIDIA driver is present: SAPIEN uses its Vulkan driver; do not set VK_ICD_FILENAMES to lavapipe (remove the driver check only if you really want CPU rendering)"
fi

command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian/Ubuntu; install Mesa >= 24 lavapipe (mesa-vulkan-drivers) with your package manager instead"
command -v dpkg >/dev/null 2>&1 || die "dpkg not found: this script supports Debian/Ubuntu only"

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || die "need root or sudo to apt-get install libvulkan1 mesa-vulkan-drivers; rerun as root"
    SUDO=(sudo)
fi

mkdir -p "$TARGET" 2>/dev/null || die "cannot create target directory $TARGET"
TARGET="$(cd "$TARGET" && pwd)"
ICD_JSON="$TARGET/lvp_icd.json"

# Serialize concurrent runs on the same target (several test workers may call us).
exec 9>"$TARGET/.install.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 900 9 || die "timed out waiting for another install into $TARGET (lock $TARGET/.install.lock)"
    if [[ -f "$ICD_JSON" ]]; then
        lib="$(icd_library "$ICD_JSON")"
        if [[ -n "$lib" && -f "$lib" ]]; then
            log "installed by a concurrent run ($lib)"
            echo "$ICD_JSON"
            exit 0
        fi
    fi
fi

# ---- 1. system packages: the Vulkan loader, Debian's Mesa (pulls in the LLVM,
# z3 and drm libraries the newer driver links against) and EGL/GL for MuJoCo.
SYSTEM_PKGS=(libvulkan1 mesa-vulkan-drivers libegl1 libegl-mesa0 libgl1 libgl1-mesa-dri libgles2 libopengl0 libglx-mesa0)
missing=()
for p in "${SYSTEM_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
APT_LOCK_OPTS=(-o DPkg::Lock::Timeout=600)
if ((${#missing[@]})); then
    log "apt-get install ${missing[*]}"
    "${SUDO[@]}" apt-get "${APT_LOCK_OPTS[@]}" update -qq >&2 || die "apt-get update failed (network or apt lock?); fix apt, then rerun"
    DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get "${APT_LOCK_OPTS[@]}" install -y -qq --no-install-recommends \
        "${missing[@]}" >&2 || die "apt-get install ${missing[*]} failed; install them by hand, then rerun"
fi

# ---- 2. a private apt configuration pointing at <codename>-backports.
CODENAME="$(. /etc/os-release && echo "${VERSION_CODENAME:-}")"
[[ -n "$CODENAME" ]] || die "cannot read VERSION_CODENAME from /etc/os-release"
[[ "$(. /etc/os-release && echo "${ID:-}")" == "debian" ]] || die "not Debian ($CODENAME): install Mesa >= 24 mesa-vulkan-drivers from your distribution and point VK_ICD_FILENAMES at its lvp_icd json"

MIRROR=""
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    MIRROR="$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources | grep -v security | head -n1 || true)"
fi
if [[ -z "$MIRROR" && -f /etc/apt/sources.list ]]; then
    MIRROR="$(awk '$1=="deb" && $0 !~ /security/ {for(i=2;i<=NF;i++) if ($i ~ /^(https?|ftp|file):/) {print $i; exit}}' /etc/apt/sources.list || true)"
fi
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
[[ -f "$KEYRING" ]] || die "missing $KEYRING: apt-get install debian-archive-keyring, then rerun"

WORK="$(mktemp -d "$TARGET/.work.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/sources" "$WORK/lists/partial" "$WORK/cache/archives/partial" "$WORK/deb"
cat >"$WORK/sources/backports.sources" <<EOF
Types: deb
URIs: $MIRROR
Suites: $CODENAME-backports
Components: main
Signed-By: $KEYRING
EOF
APT_PRIVATE=(
    -o Dir::Etc::SourceList=/dev/null
    -o Dir::Etc::SourceParts="$WORK/sources"
    -o Dir::State::Lists="$WORK/lists"
    -o Dir::Cache="$WORK/cache"
    -o APT::Sandbox::User=root
)
log "apt-get update ($MIRROR $CODENAME-backports, private lists)"
apt-get "${APT_PRIVATE[@]}" update -qq >&2 || die "apt-get update of $MIRROR $CODENAME-backports failed (network?)"

# Pick the backports version explicitly: the private lists hold only backports,
# but the system's dpkg status could otherwise satisfy the request.
VERSION="$(apt-cache "${APT_PRIVATE[@]}" madison mesa-vulkan-drivers 2>/dev/null \
    | awk -F'|' '$3 ~ /backports/ {gsub(/ /,"",$2); print $2; exit}')"
[[ -n "$VERSION" ]] || die "mesa-vulkan-drivers not found in $CODENAME-backports at $MIRROR"
case "$VERSION" in
    2[4-9].*|[3-9][0-9].*) ;;
    *) die "backports offers mesa-vulkan-drivers $VERSION; SAPIEN needs Mesa >= 24" ;;
esac
log "apt-get download mesa-vulkan-drivers=$VERSION"
(cd "$WORK/deb" && apt-get "${APT_PRIVATE[@]}" download -qq "mesa-vulkan-drivers=$VERSION" >&2) \
    || die "apt-get download mesa-vulkan-drivers=$VERSION failed"
DEB="$(ls "$WORK"/deb/mesa-vulkan-drivers_*.deb 2>/dev/null | head -n1)"
[[ -n "$DEB" ]] || die "apt-get download produced no .deb in $WORK/deb"

# ---- 3. unpack and write the ICD json.
rm -rf "$TARGET/root"
dpkg -x "$DEB" "$TARGET/root" || die "dpkg -x $DEB failed"
LIB="$(find "$TARGET/root" -name libvulkan_lvp.so -type f | head -n1)"
[[ -n "$LIB" ]] || die "libvulkan_lvp.so not found in $DEB"
if unresolved="$(ldd "$LIB" 2>&1 | grep 'not found')"; then
    die "$LIB misses system libraries: $(echo "$unresolved" | awk '{print $1}' | tr '\n' ' ')- install them with apt-get, then rerun"
fi
SHIPPED_JSON="$(find "$TARGET/root" -name 'lvp_icd*.json' | head -n1)"
API_VERSION=""
if [[ -n "$SHIPPED_JSON" ]]; then
    API_VERSION="$(sed -n 's/.*"api_version"[[:space:]]*:[[:space:]]*"\([^"]*\)".*/\1/p' "$SHIPPED_JSON" | head -n1)"
fi
API_VERSION="${API_VERSION:-$FALLBACK_API_VERSION}"
cat >"$ICD_JSON.tmp" <<EOF
{
    "file_format_version": "1.0.0",
    "ICD": {
        "api_version": "$API_VERSION",
        "library_path": "$LIB"
    }
}
EOF
mv "$ICD_JSON.tmp" "$ICD_JSON"
echo "$VERSION" >"$TARGET/VERSION"
log "installed Mesa $VERSION lavapipe; now: export VK_ICD_FILENAMES=$ICD_JSON"
echo "$ICD_JSON"
