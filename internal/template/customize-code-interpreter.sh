#!/bin/sh
# Customises the code-interpreter rootfs after the base hook ran. $1 is the new rootfs. The
# code-execution service itself is mounted by the node with envd (/opt/vmon/bin).
set -eu
root="$1"

# Fail the build if a promised language or library is missing.
chroot "$root" python3 -c 'import ipykernel, numpy, pandas, matplotlib, scipy, sklearn, seaborn, plotly'
chroot "$root" Rscript -e 'library(IRkernel)' >/dev/null
chroot "$root" sh -c 'command -v node >/dev/null && command -v bash >/dev/null'

# What the first kernel of a sandbox would otherwise build on the spot (seconds under gVisor):
# matplotlib's font cache and IPython's profile, in the default user's home.
chroot "$root" su -s /bin/sh user -c 'cd && MPLBACKEND=Agg python3 -c "import matplotlib.pyplot, IPython.paths; IPython.paths.get_ipython_dir()"'
rm -rf "$root"/root/.cache
