#!/usr/bin/env bash
# ctest's entry to the Python tests: runs pytest on python/tests with the first Python that can
# import torch (the PATH's python3, then the distribution's /usr/bin/python3, where Debian's
# python3-torch lives). Exits 77 (CTest "skipped") only when no Python has torch.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
for py in python3 /usr/bin/python3; do
  command -v "$py" >/dev/null 2>&1 || continue
  if "$py" -c "import torch" >/dev/null 2>&1; then
    exec "$py" -m pytest -q -p no:cacheprovider "$here" "$@"
  fi
done
echo "SKIPPED: no Python with torch (install python3-torch: bash scripts/install_deps.sh)"
exit 77
