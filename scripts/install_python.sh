#!/usr/bin/env bash
# Installs the Python package `nsa` (python/nsa) for the distribution's Python: the packages
# (python3-torch and the rest, via install_deps.sh), the C library libnsa_capi in build/, and a
# .pth file in site-packages that points at python/, so `import nsa` works from anywhere without
# pip (Debian's Python is externally managed). Re-run after pulling to rebuild the library.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"

bash scripts/install_deps.sh --python
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build --target nsa_capi -j "$(nproc)"

py=/usr/bin/python3
if [ -n "${NSA_SITE_DIR:-}" ]; then  # where to put nsa.pth instead (a virtualenv's site-packages)
  site="$NSA_SITE_DIR"
elif [ "$(id -u)" -eq 0 ]; then
  site="$("$py" -c 'import site; print(site.getsitepackages()[0])')"
else
  site="$("$py" -c 'import site; print(site.getusersitepackages())')"
fi
mkdir -p "$site"
echo "$repo/python" > "$site/nsa.pth"
"$py" -c "import site; site.addsitedir('$site'); import nsa, sys
print('installed nsa (library %s) for %s via %s/nsa.pth' % (nsa.LIB_PATH, sys.executable, '$site'))"
