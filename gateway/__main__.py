"""`python -m gateway`: serve the capture gateway (see gateway/cli.py)."""

from gateway.cli import main

main()
