#!/usr/bin/env bash
# Runs, on a GPU machine with no systemd and no package access (the project's Ubuntu 24.04 H200), what of
# gpufleet needs no package installation, over a local connection, writing each step's output to OUTDIR:
#   - preflight's release check (playbooks/vars/platforms.yml) on the machine's facts;
#   - the base and Python layers' playbooks in check mode (apt in check mode names what it would install);
#   - drift of the base, driver, gpu_health, toolkit and python layers (read-only, against the real host);
#   - CPython compiled from the mirror's tarball with the build dependencies the machine has, and which of
#     the role's build dependencies for this release (roles/pyenv_python/vars/<distribution>-<major>.yml)
#     dpkg lists as installed or missing; the runtime libraries the 64-bit time_t transition renamed.
#   usage: scripts/verify-local-ubuntu.sh PYTHON STACK_FILE CPYTHON_TARBALL OUTDIR
# PYTHON has ansible-core; STACK_FILE is the stack this machine runs (stacks/h200-device.yml on the H200).
# Modules run with the system's /usr/bin/python3 where it has python3-apt (apt's check mode needs it), else
# with PYTHON.
set -uo pipefail

python="$1" stack="$2" tarball="$3" outdir="$4"
cd "$(dirname "$0")/.."
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)" tarball="$(cd "$(dirname "$tarball")" && pwd)/$(basename "$tarball")"
work="$(mktemp -d)"
export ANSIBLE_CONFIG="$PWD/ansible.cfg" LC_ALL=C.UTF-8 ANSIBLE_FORCE_COLOR=0
bindir="$(dirname "$python")"
target_python="$python"
/usr/bin/python3 -c 'import apt' 2>/dev/null && target_python=/usr/bin/python3

cat >"$work/hosts.yml" <<HOSTS
gpu_nodes:
  hosts:
    localhost:
      ansible_connection: local
      ansible_python_interpreter: $target_python
      ansible_become: false
      # Nothing is fetched: the mirror is a placeholder and every runfile's sha256 is zeros.
      gpufleet_mirror_url: http://mirror.invalid
HOSTS
"$python" - "$stack" >"$work/stack.json" <<'PY'
import json, sys, yaml
stack = yaml.safe_load(open(sys.argv[1]))
runfiles = [f"NVIDIA-Linux-x86_64-{stack['driver']}.run", "cuda_13.0.0_580.65.06_linux.run",
            "cuda_13.0.1_580.82.07_linux.run", "cuda_13.0.2_580.95.05_linux.run", "pyenv-2.6.30.tar.gz"]
print(json.dumps({"gpufleet_stack": stack, "gpufleet_artifact_sha256": {name: "0" * 64 for name in runfiles}}))
PY

step() {  # step NAME COMMAND...: output and exit status to OUTDIR/NAME.txt, its tail to the console
  local name="$1"; shift
  echo "=== $name: $*"
  "$@" >"$outdir/$name.txt" 2>&1
  echo "rc=$?" >>"$outdir/$name.txt"
  tail -n 25 "$outdir/$name.txt"
}

step os sh -c 'cat /etc/os-release; uname -r; ls -l /sbin/init; cat /proc/1/comm; command -v gcc; gcc --version | head -1; ldd --version | head -1; dpkg-query -W python3-apt systemd nginx 2>&1; echo "modules run with '"$target_python"'"'
step preflight_release "$bindir/ansible-playbook" -i "$work/hosts.yml" -e "@$work/stack.json" playbooks/preflight.yml \
  --start-at-task "Read each host's distribution and release"
step base_check "$bindir/ansible-playbook" --check -i "$work/hosts.yml" -e "@$work/stack.json" playbooks/base.yml
step python_check "$bindir/ansible-playbook" --check -i "$work/hosts.yml" -e "@$work/stack.json" playbooks/python.yml
GPUFLEET_DRIFT_REPORT_DIR="$work/drift" GPUFLEET_DRIFT_RUN_ID=device-ubuntu ANSIBLE_CALLBACKS_ENABLED=gpufleet_drift \
  step drift "$bindir/ansible-playbook" --check -i "$work/hosts.yml" -e "@$work/stack.json" playbooks/drift.yml \
  -e '{"drift_layers": ["base", "driver", "gpu_health", "toolkit", "python"]}'
cp "$work/drift/report.json" "$outdir/drift.json" 2>/dev/null

# The role's build dependencies for this release, as the role's first_found would pick them.
. /etc/os-release
deps="roles/pyenv_python/vars/${NAME%% *}-${VERSION_ID%%.*}.yml"
step build_deps sh -c "\"$python\" -c 'import sys, yaml; print(\"\\n\".join(yaml.safe_load(open(sys.argv[1]))[\"__pyenv_python_build_packages\"]))' $deps \
  | while read -r p; do s=\$(dpkg-query -W -f='\${db:Status-Abbrev} \${Version}' \"\$p\" 2>/dev/null); \
    case \"\$s\" in ii*) echo \"installed \$p \${s#ii }\";; *) echo \"missing \$p\";; esac; done"
step t64_libraries sh -c "dpkg-query -W -f='\${Package} \${Version}\n' 'libssl3*' 'libreadline8*' 'libncursesw6*' 'libsqlite3-0*' 'libffi8*' 'liblzma5*' 'libgdbm6*' 'libnuma1*' 2>&1; \
  ls /var/lib/apt/lists | head -5; apt-cache policy libncurses-dev libncursesw5-dev libssl3t64 2>&1 | head -12"

# CPython from the mirror's tarball with the toolchain and headers this machine has: configure and make say
# which optional modules lack their headers, i.e. which build dependencies are missing.
mkdir -p "$work/src" && tar -xzf "$tarball" -C "$work/src"
src="$(echo "$work"/src/Python-*)"
step cpython_configure sh -c "cd '$src' && ./configure --prefix='$work/prefix' --enable-shared"
step cpython_make sh -c "cd '$src' && make -j\$(nproc) 2>&1 | tail -n 40"
step cpython_modules sh -c "cd '$src' && LD_LIBRARY_PATH=. ./python -c 'import ssl, sqlite3, ctypes, lzma, bz2, zlib, readline, curses, dbm.gnu, uuid; print(ssl.OPENSSL_VERSION); print(\"all modules import\")'"
rm -rf "$work"
