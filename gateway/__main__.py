"""`python -m gateway`: serve the capture gateway (see gateway/http/cli.py)."""

from gateway.http.cli import main

if (
    __name__ == "__main__"
):  # a spawned tokenization worker imports this module too (gateway/intake/tokenization.py)
    main()
