"""Every click command of the package, and nothing else imports click.

Three console scripts start here: `nvrx-appliance` (main.py, the lazy command table),
`nvrx-watch` (watch.py) and `nvrx-entrypoint` (entrypoint.py). Each module is the
command-line face of the layer it drives (chain.py: submit, status, logs and cancel
through api.py; qualify.py and demo.py: the workflows; image.py, cluster.py), turning
options into calls and outcomes into lines and exit codes (fail.py). The work itself,
and every message a library caller needs too, lives below.
"""
