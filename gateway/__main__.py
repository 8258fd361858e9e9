"""`python -m gateway`: serve the capture gateway (see gateway/cli.py)."""

from gateway.cli import main

if __name__ == "__main__":  # a spawned tokenization worker imports this module too (gateway/tokenization.py)
    main()
